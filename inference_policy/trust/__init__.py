"""Trust: what the owner signed, whether it is verified and usable now, and what it means.

The strict profile schema (`profile`), its Ed25519 verification and the ConfigMap that carries it
(`signing`, with `usable_profile`: is the profile usable at this instant), the rollback floor
below which no revision is planned or placed under (`rollback`), the seed's rules `tmi sign`
holds a new profile to (`seed_rules`), and what a DRA binding becomes in the cluster: its
DeviceClass, claim templates and the claim a plan gives the engine (`dra_claims`).

A binding's allocation class (`inference_policy.allocation`) is the layer below: the profile
asks it which guarantee a binding gives, and the classes read the binding only through the facts
they declare (`allocation.binding_facts`), never the profile's models.

May import: `inference_policy.allocation` and the base. Planning, placing, admission, granting
and the owner tools import it, never the reverse.
"""
