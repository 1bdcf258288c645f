"""``python -m agentenv_nb.tasks.gridsim OUT --train N --eval M --seed S``: write a GridSim bundle."""

import argparse

from . import baseline_scores, read_days, write_bundle

parser = argparse.ArgumentParser(prog="python -m agentenv_nb.tasks.gridsim", description=__doc__)
parser.add_argument("out", help="the bundle folder to write")
parser.add_argument("--train", type=int, default=2000, help="train days (default 2000)")
parser.add_argument("--eval", type=int, default=200, help="eval days, the ones after the train days (default 200)")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--overwrite", action="store_true", help="replace the folder if it exists")
args = parser.parse_args()
bundle = write_bundle(args.out, train=args.train, eval=args.eval, seed=args.seed, overwrite=args.overwrite)
scores = baseline_scores(read_days(bundle, "eval"))
print(f"wrote {bundle}: {args.train} train and {args.eval} eval days; eval baselines "
      + ", ".join(f"{name} {value:.3f}" for name, value in scores.items()))
