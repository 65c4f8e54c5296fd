"""Fairness-a11y/TRIX's training setup: its train.py / arguments.py / datasets.py are DAFA's with other defaults
(150 epochs); the same statements as gen_setup_dafa.py, with the flags of scripts/trades.sh."""
from gen_setup_dafa import setup

REPO = "Fairness-a11y/TRIX"
PINNED = "cdeb435fde5c538842c08203aee51f8b80754da6"


def generate(path, inp):
    return {"setup_trix": setup(path, inp, "trades.sh", "TRIX")}
