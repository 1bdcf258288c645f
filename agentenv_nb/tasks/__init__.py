"""Tasks: the bundles the kit knows (``bundles``: bundles.txt, the Hub, describing a bundle) and GridSim (``gridsim``:
its battery rules, exact optimum, baselines, prices, and the bundle generator with its env and verifier)."""
