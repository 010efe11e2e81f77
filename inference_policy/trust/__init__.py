"""Trust: what the owner signed, whether it is verified and usable now, and what it means.

The strict profile schema (`profile`), its Ed25519 verification and the ConfigMap that carries it
(`signing`, with `usable_profile`: is the profile usable at this instant), the rollback floor
below which no revision is planned or placed under (`rollback`), the seed's rules `tmi sign`
holds a new profile to (`seed_rules`), and what a DRA binding becomes in the cluster: its
DeviceClass, claim templates and the claim a plan gives the engine (`dra_claims`).

A binding's allocation class (`inference_policy.allocation`) sits beside the profile, one
layer with it: the profile asks the class which guarantee a binding gives, and the classes read
the profile's binding models.

May import: the base and `inference_policy.allocation`. Planning, placing, admission, granting
and the owner tools import it, never the reverse.
"""
