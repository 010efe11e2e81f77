"""Planning: a deployment request in, a plan or the seed's exact refusal out.

The request (`request`), the request rules every deployment passes (`request_rules`), the
engine catalog and image selection (`catalog`), the pinned recipes (`recipes`, `recipe_inputs`),
the memory a deployment holds (`sizing`), the choice of binding on the GPU path (`gpu_plan`),
the room figures the owner publishes and the rule that spills to a larger binding with them
(`room`), what a decision is and what it is decided from (`decision`), the planner itself
(`planner`), and the one typed plan with its one parser (`plan`) that every later part reads.

The planner cannot see Nodes: it reads the room figures as published text, never the nodes
they were computed from (that computation is placing's, `placing.room_figures`).

May import: the base, trust and allocation. Never placing, admission, granting or the tools.
"""
