"""`python -m localcluster.demo` (`make demo`): the owner's workflow, then the cluster."""

from localcluster.demo.workflow import main

raise SystemExit(main())
