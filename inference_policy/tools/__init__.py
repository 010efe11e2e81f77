"""The owner tools: what `tmi` answers an owner offline, from the servers' own decisions.

The capacity replay and tenant quotas in it (`capacity`, `quota_replay`), `tmi doctor`'s
judgments (`doctor`), the `tmi detect` derivation (`detection`, `host_facts`), a profile draft
by the seed's rules (`draft`), what a new revision changes (`revisions_compare`), and the
inventory of every tenant-writable input an owner part reads (`tenant_inputs`, its rows in
`tenant_input_*`).

May import: every part below it. Nothing in the core imports the tools;
`inference_policy.evidence` is their independent sibling.
"""
