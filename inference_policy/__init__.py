"""The pure core of tenant-mode inference: signed owner profiles, engine catalog, planner.

Everything here is deterministic and free of I/O: callers pass in bytes, keys and the clock, and
get back values. The webhook, the scheduler extender, the allocation controller and the owner CLI
all decide through this package, so they cannot disagree.

The core is in parts, each a subpackage whose docstring says what it decides and what it may
import. They are layers, top to bottom; a part imports only the parts below it, and two parts
on one line joined by `|` never import each other (`lint-imports` holds this, from the layers
contract in pyproject.toml):

    tools | evidence      what `tmi` answers an owner offline; GPU-sharing evidence
    granting              the AllocationVerified verdict, and what the extender may place
    admission | placing   an engine Pod at admission and the owner's policies' CEL;
                          the node verdicts, ledgers, tenancy and quota
    planning              a request in, a plan or a refusal out; the one plan parser
    trust                 the signed profile, its verification and its rollback floor
    allocation            the allocation classes, GFD's labels, a DRA device's facts
    base                  wire names, quantities, strict JSON, the Pod view, access, the
                          stable codes

`data/` holds the engine catalog this release ships.
"""
