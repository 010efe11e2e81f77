"""Placing: may a planned engine Pod run on a node, how well does it fit, and how much do the
nodes and the tenants hold.

What the extender knows of a Node and whether it is the hardware a binding vouches for
(`nodes`), what each node holds (`ledger`), one tenant per non-isolating device (`tenancy`), the
fit, the verdict and the score (`placement`, `fragmentation`, `spread`), the room figures
computed from the nodes for the webhook to plan with (`room_figures`), the owner's quota per
tenant (`quota`) and the owner's second scheduler's configuration (`schedconfig`).

May import: planning (the plan it places), trust, allocation and the base. Admission is its
independent sibling: neither imports the other. Granting and the tools import it.
"""
