"""What the papers and other code bases call the methods: the hint when ``--method`` gets one of these names.

Case, ``_`` and ``-`` do not matter (``ME_AT`` finds ``me-at`` by itself). A name here that is no
method of its own (CFA is options on a method; HE a head and a margin) names the flags or presets that
make it.
"""
from fastfair.methods.base import METHODS

_HE = ("--method pgd-at --set model.head=cosine --set he.margin=0.2 (PGD-HE; --method trades for TRADES-HE; HE is "
       "a head and a margin on a method), or a preset: tian-iclr-t5-he, tian-iclr-t5-he-lis, tian-iclr-t5-he-cmp")

METHODS.aliases({
    "cfa": ("--method trades --ccm --ccr --fawa (CFA-TRADES; CFA is options on a method, not a method of its own), "
            "--method pgd-at --ccm --fawa (CFA-AT), --method fat --ccm --fawa (CFA-FAT), or a preset of CFA's "
            "tables: cfa-t1-trades-cfa-paper, cfa-t1-at-cfa-paper, cfa-t1-fat-cfa-paper (fastfair presets)"),
    "cfa-at": "--method pgd-at --ccm --fawa (preset cfa-t1-at-cfa-paper)",
    "cfa-trades": "--method trades --ccm --ccr --fawa (preset cfa-t1-trades-cfa-paper)",
    "cfa-fat": "--method fat --ccm --fawa (preset cfa-t1-fat-cfa-paper)",
    "ccm": "--ccm on a method, e.g. --method trades --ccm (CFA's class-wise margin is an option, ccm.enabled)",
    "ccr": "--ccr on a method, e.g. --method trades --ccr (CFA's class-wise TRADES beta is an option, ccr.enabled)",
    "fawa": "--fawa on a method, e.g. --method trades --fawa (weight averaging, train.averaging=fawa)",
    "ema": "--ema on a method, e.g. --method trades --ema (weight averaging, train.averaging=ema)",
    "he": _HE, "pgd-he": _HE, "trades-he": _HE, "hypersphere": _HE, "he-lis": _HE, "he-cmp": _HE,
    "at": "pgd-at", "pgd": "pgd-at", "madry": "pgd-at", "adversarial-training": "pgd-at",
    "natural": "standard", "erm": "standard", "clean": "standard",
    "me": "me-at or me-trades (the ME paper's ME-AT and ME-TRADES)",
    "maximum-entropy": "me-at or me-trades (the ME paper's ME-AT and ME-TRADES)",
    "friendly-at": "fat",
    "frl-reweight": "frl-rw", "frl-remargin": "frl-rm", "frl-reweight-remargin": "frl", "frl-rmrw": "frl",
    "frl-rwrm": "frl",
    "dafa": "dafa-trades (DAFA's tables) or dafa-at (its code's --loss pgd)",
    "faal": "faal-at or faal-trades (FAAL's code: --loss AT or TRADES)",
    "cost-sensitive": "an option on a method: --set cost_sensitive.weights=[...] or --set cost_sensitive.auto=true",
    "label-smoothing": "--set method.smoothing=0.1 on any method (ME paper Table 1: 0.1)",
})
