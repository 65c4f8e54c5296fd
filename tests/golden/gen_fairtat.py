"""FAIR-TAT (TejaswiniMedi/FAIR-TAT): target_train_new.py's ``train_epoch`` (the target draw, the logger's per-class
statistics) with Targeted_attack.py's ``cw_pgd_loss`` (the targeted attack, the loss and its weight gradient), and
the class-wise eps / target-score block of the script's epoch loop over several epochs.

No clone of the repository could be made here: the files are the versions the tool library's index holds, each
named by its commit (``FILES``). The script is top level (data, model, epoch loop), so the definitions used are
taken from the parsed files (``DEFINITIONS``; the epoch loop's ``if epoch >= args.begin:`` block) and run in a
namespace holding what they read; ``check_files`` refuses a checkout whose definitions' syntax trees differ from
the versions read (``TREES``, sha256 of ``ast.dump``), so a transcription of just those definitions will do.
``normalize`` is the identity there (utils.normalize_cifar at 164a30d returns x; the model normalises inside).
"""
import ast
import hashlib
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

from conformance import Recorder
from conformance_fat import encode
from record import Capture

REPO = "TejaswiniMedi/FAIR-TAT"
FILES = {"target_train_new.py": "0154dc3b4a719482d09eaa163fece2cc9ee00d03",
         "Targeted_attack.py": "01888696b93b494f9dcd86616562fb13255a9299"}
PINNED = FILES["target_train_new.py"]
# The code's own casts to float32 are none: train_epoch's target scores (the CCM block's numpy cw_scaling) and class
# eps (torch.tensor of a numpy float64 array) are float64 in either run, and cw_attack_pgd's eps tensor, start and
# iterates follow x's dtype; what else allocates (torch.ones(10) eps before the CCM block, the made-up clean logits
# of Answers) and this generator's .float() of the trace's eps are make.py's FLOAT64_RUN
FLOAT64 = []
SCRIPT, ATTACK = FILES
DEFINITIONS = {SCRIPT: ("CW_log", "train_epoch", "get_rand_target"), ATTACK: ("cw_attack_pgd", "cw_pgd_loss")}
CCM_BLOCK = "epoch >= args.begin"  # the epoch loop's class_eps / cw_scaling block
TREES = {
    "CW_log": "18d03ac151e27b81ed2ed78ce79114112b82b2824187c9a3f37aec243fa0fcb9",
    "train_epoch": "837b9b9b8eeb7af03fa8cfc555803541fd393c814447a23e22b113bf8668523c",
    "get_rand_target": "3c52d27bf70f2e6e95e318aec1f8f0a931a93c665796c681ade6977c1d46603f",
    "cw_attack_pgd": "9469a72504241badfdf874c35b6cd64eab034fc567f649afae7d9e050602fc52",
    "cw_pgd_loss": "4c0a5fc99d9125a45ecd9090085c77c02465684b6bbb30bd2fd827e33dc97ef2",
    CCM_BLOCK: "79c00eace4544fced530279e21f1237a72734d2fcd822f1a8f649a0c809f29a5",
}
# target_train_new.py defaults and the README's command (--mode AT --ccm --lambda-r 0.5 --lambda-c 0.5
# --untargeted 0 --adaptive_eps G-rob): eps 8/255, step 2/255, 10 steps, --begin 1, --kldiv 0
SETTINGS = {"epsilon": 8 / 255, "alpha": 2 / 255, "attack_iters": 10, "lambda_r": 0.5, "lambda_c": 0.5, "begin": 1,
            "kldiv": 0.0, "untargeted": 0, "adaptive_eps": ["G-rob"], "adaptive_eps_aggr": "avg"}
K = 10
BATCH = 16
LOOP = {"epochs": 5, "per_class": 4, "batch_size": 16}
DRAW = {"batches": 400, "batch_size": 500}
# made-up false-positive shares of the draw check: concentrated, so that softmax(2 F) is far from uniform
DRAW_SHARES = [0.0, 0.0, 0.45, 0.3, 0.0, 0.15, 0.1, 0.0, 0.0, 0.0]


def nodes(path):
    """{name: node} of DEFINITIONS and the epoch loop's CCM block, from the parsed files."""
    out = {}
    for file, names in DEFINITIONS.items():
        tree = ast.parse((path / file).read_text())
        out.update({n.name: n for n in tree.body if getattr(n, "name", None) in names})
        if file == SCRIPT:
            out[CCM_BLOCK] = next(n for n in ast.walk(tree)
                                  if isinstance(n, ast.If) and ast.unparse(n.test) == CCM_BLOCK)
    return out


def tree_hash(node) -> str:
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()


def check_files(path) -> str:
    """PINNED, where every definition used has the syntax tree of the index versions (make.py calls it in place of
    a git commit check)."""
    found = nodes(path)
    bad = [name for name, digest in TREES.items() if name not in found or tree_hash(found[name]) != digest]
    if bad:
        raise SystemExit(f"make.py: error: {path}: {', '.join(bad)} differ from {REPO} at {FILES}")
    return PINNED


class EasyDict(dict):
    """easydict.EasyDict as the script uses it: a dict whose keys are attributes."""

    __getattr__ = dict.__getitem__

    def __setattr__(self, name, value):
        self[name] = value


class Torch(types.SimpleNamespace):
    """torch with ``multinomial`` recording the probabilities it is given and, while ``first`` is set, answering
    its next batch-sized call with that draw (the one-collision batch)."""

    def __init__(self):
        super().__init__(probs=[], first=None)

    def __getattr__(self, name):
        return getattr(torch, name)

    def multinomial(self, probs, n, **kw):
        if n > 1:
            self.probs.append(probs.clone())
            if self.first is not None:
                return self.first.clone()
        return torch.multinomial(probs, n, **kw)


def namespace(path, **globals_):
    """The script's definitions compiled into one namespace with what they read."""
    found = nodes(path)
    args = types.SimpleNamespace(random_target=False, debug=False, **{k: v for k, v in SETTINGS.items()
                                                                      if k not in ("epsilon", "alpha")})
    fn = Torch()
    ns = {"np": np, "torch": fn, "edict": EasyDict, "args": args, "num_classes": 10, "normalize": lambda t: t,
          "device": torch.device("cpu"), "eps": SETTINGS["epsilon"], "save_epoch_data": lambda *a: None,
          "print": lambda *a, **k: None, "F": F, "nn": torch.nn, **globals_}
    for name in DEFINITIONS[ATTACK]:
        exec(compile(ast.Module([found[name]], []), str(path / ATTACK), "exec"), ns)
    for name in DEFINITIONS[SCRIPT]:
        exec(compile(ast.Module([found[name]], []), str(path / SCRIPT), "exec"), ns)
    ns["ccm_block"] = compile(ast.Module([found[CCM_BLOCK]], []), str(path / SCRIPT), "exec")
    return ns


def calibrate(ns, epoch, results):
    """The epoch loop's CCM block at ``epoch`` after the train results ``results``: class_eps, cw_scaling."""
    ns.update(epoch=epoch, log_train_results=results)
    exec(ns["ccm_block"], ns)
    return ns["class_eps"], ns["cw_scaling"]


def made_up_result(rng):
    """A train result of the CCM block's reading: per-class robust accuracy (K tp / N) and false-positive shares."""
    acc = rng.integers(0, 4901, 10) / 4900.0
    fp = rng.integers(0, 50, 10).astype(np.float64)
    return EasyDict(robust_cw_acc_gt=acc, robust_cw_cfps_gt=fp / fp.sum())


def step(path, inp):
    """train_epoch for one batch of the first BATCH fixed images with the real cw_pgd_loss, in the second epoch
    (targets from the made-up last epoch's false positives, class-wise eps from its accuracy)."""
    ns = namespace(path)
    last = made_up_result(np.random.default_rng(0))
    class_eps, cw_scaling = calibrate(ns, 1, [last])
    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = inp.model("train")
    rec, opt, handed = Recorder(model), Capture(model), {}

    def attack(**kw):
        handed["y_t"] = kw["y_t"].clone()
        loss, out = ns["cw_pgd_loss"](**kw)
        handed["loss"] = loss.detach().clone()
        return loss, out

    torch.manual_seed(1)
    result = ns["train_epoch"](model=rec, loader=[(x, y)], opt=opt, device="cpu", attack=attack, eps=class_eps,
                               cw_scaling=cw_scaling, beta=None, alpha=SETTINGS["alpha"], n_iters=K, epoch=1)
    # forwards: K attack iterates, the loss's x + delta, then two clean ones (output_clean, the logger's)
    assert len(rec.iterates) == K and len(rec.inputs) == K + 3
    its = rec.iterates + [rec.inputs[K]]
    # the code steps delta - alpha sign(grad CE(., y_t)): the trace's sign code is that of the ascent, -grad
    arrays = encode("attack", x, its, [-g for g in rec.grads], class_eps[y].float(), SETTINGS["alpha"])
    n = len(y)
    arrays.update({"last_acc": last.robust_cw_acc_gt, "last_fp": last.robust_cw_cfps_gt,
                   "class_eps": class_eps.numpy(), "cw_scaling": np.asarray(cw_scaling),
                   "probs": ns["torch"].probs[0].numpy(), "y_t": handed["y_t"].numpy(),
                   "loss": handed["loss"].numpy(), "weight_grad": opt.grad.numpy(),
                   "tp": np.rint(result.robust_cw_acc_gt * n / 10), "fp": result.robust_cw_cfps_gt})
    return arrays


class Answers:
    """The loop's model and attack, answering made-up adversarial logits of (epoch, image): a batch's inputs
    are its image indices."""

    def __init__(self, adv):
        self.adv, self.epoch, self.handed = adv, 0, []

    def attack(self, x, y, y_t, **kw):
        self.handed.append(y_t.clone())
        rows = torch.from_numpy(self.adv[self.epoch][x.long().flatten().numpy()]).requires_grad_()
        return F.cross_entropy(rows, y), rows.detach()

    def __call__(self, x):  # the clean forwards: unused by anything recorded
        return torch.zeros(len(x), 10)

    def train(self, mode=True):
        return self


def loop(path):
    """train_epoch and the CCM block over LOOP epochs of 40 images (4 a class: the code's K tp / N is then the
    class's accuracy), made-up adversarial logits answering the attack."""
    rng = np.random.default_rng(2)
    e, n = LOOP["epochs"], 10 * LOOP["per_class"]
    y = np.repeat(np.arange(10), LOOP["per_class"])
    adv = rng.normal(0, 2.0, (e, n, 10)).astype(np.float32)
    order = rng.permutation(n)
    loader = [(torch.from_numpy(b)[:, None].float(), torch.from_numpy(y[b]))
              for b in np.split(order, range(LOOP["batch_size"], n, LOOP["batch_size"]))]
    ns = namespace(path)
    answers = Answers(adv)
    opt = types.SimpleNamespace(zero_grad=lambda: None, step=lambda: None)
    class_eps, cw_scaling = torch.ones(10) * SETTINGS["epsilon"], torch.ones(10)  # the script's, before the loop
    ns["class_eps"] = class_eps
    results, out = [], {k: [] for k in ("class_eps", "probs", "acc", "fp")}
    torch.manual_seed(2)
    for epoch in range(e):
        if epoch >= SETTINGS["begin"]:
            class_eps, cw_scaling = calibrate(ns, epoch, results)
        answers.epoch = epoch
        probs = len(ns["torch"].probs)
        results.append(ns["train_epoch"](model=answers, loader=loader, opt=opt, device="cpu",
                                         attack=lambda **kw: answers.attack(**kw), eps=class_eps,
                                         cw_scaling=cw_scaling, beta=None, alpha=SETTINGS["alpha"], n_iters=K,
                                         epoch=epoch))
        drawn = ns["torch"].probs[probs:]
        assert (epoch == 0) == (not drawn)  # the first epoch draws uniform targets, the others from the scores
        out["class_eps"].append(torch.as_tensor(class_eps, dtype=torch.float64).numpy())
        out["probs"].append(drawn[0].numpy() if drawn else np.full(10, np.nan))
        out["acc"].append(results[-1].robust_cw_acc_gt)
        out["fp"].append(results[-1].robust_cw_cfps_gt)
    return {"labels": y, "batch_order": order, "adv_logits": adv, **{k: np.stack(v) for k, v in out.items()}}


def draws(path):
    """The code's target draw as train_epoch makes it: DRAW batches of uniform labels in the second epoch from
    fixed false-positive shares and in the first, counted by (label, target); and two batches whose first draw is
    served: one with exactly one draw equal to its label, one with two."""
    ns = namespace(path)
    fn = ns["torch"]
    cw_scaling = np.asarray(DRAW_SHARES) * 2
    handed = []

    def attack(y, y_t, **kw):
        handed.append(y_t.clone())
        rows = torch.zeros(len(y), 10, requires_grad=True)
        return rows.sum(), rows.detach()

    opt = types.SimpleNamespace(zero_grad=lambda: None, step=lambda: None)
    model = Answers(np.zeros((1, 1, 10), np.float32))
    g = torch.Generator().manual_seed(3)
    labels = [torch.randint(0, 10, (DRAW["batch_size"],), generator=g) for _ in range(DRAW["batches"])]
    ns["class_eps"] = torch.ones(10) * SETTINGS["epsilon"]
    out = {}
    torch.manual_seed(3)
    for epoch in (0, 1):
        handed.clear()
        ns["train_epoch"](model=model, loader=[(y.float()[:, None], y) for y in labels], opt=opt, device="cpu",
                          attack=attack, eps=None, cw_scaling=cw_scaling, beta=None, alpha=SETTINGS["alpha"],
                          n_iters=K, epoch=epoch)
        counts = np.zeros((10, 10), np.int64)
        np.add.at(counts, (torch.cat(labels).numpy(), torch.cat(handed).numpy()), 1)
        out[f"counts_epoch{epoch}"] = counts
    out["probs"] = fn.probs[0].numpy()
    y = torch.arange(8)
    for name, first in (("one", [1, 1, 3, 4, 5, 6, 7, 0]), ("two", [1, 1, 2, 4, 5, 6, 7, 0])):
        fn.first = torch.tensor(first)
        handed.clear()
        ns["train_epoch"](model=model, loader=[(y.float()[:, None], y)], opt=opt, device="cpu", attack=attack,
                          eps=None, cw_scaling=cw_scaling, beta=None, alpha=SETTINGS["alpha"], n_iters=K, epoch=1)
        out[f"{name}.first"], out[f"{name}.y_t"] = np.array(first), handed[0].numpy()
    fn.first = None
    out["labels_quirk"] = y.numpy()
    return out


def generate(path, inp):
    sys.modules.setdefault("easydict", types.SimpleNamespace(EasyDict=EasyDict))
    check_files(path)
    ff = {"file": SCRIPT, "commit": FILES[SCRIPT]}
    sources = {"attack": {"file": ATTACK, "function": "cw_pgd_loss", "commit": FILES[ATTACK]},
               "targets": {**ff, "function": "train_epoch"}, "statistics": {**ff, "function": "CW_log"},
               "calibration": {**ff, "function": "__main__ (epoch loop: if epoch >= args.begin)"}}
    meta = {"file": SCRIPT, "function": "train_epoch", "settings": SETTINGS, "files": FILES, "sources": sources}
    step_meta = {**meta, "batch": BATCH,
                 "made_up": "last_acc, last_fp: the previous epoch's train result the CCM block reads",
                 "attack.*": "the trace of cw_pgd_loss's targeted PGD (conformance_fat.encode) from the code's start",
                 "probs": "the softmax(cw_scaling) train_epoch hands torch.multinomial; y_t the targets it drew",
                 "tp, fp": "the batch's robust true positives per class and false-positive shares (CW_log)"}
    loop_meta = {**meta, "loop": LOOP, "adv_logits": "made-up adversarial logits per epoch and image",
                 "class_eps": "the eps each epoch trained with; probs: its target distribution (NaN in the first)",
                 "acc, fp": "each epoch's robust_cw_acc_gt and robust_cw_cfps_gt"}
    draw_meta = {**meta, "draw": DRAW, "shares": DRAW_SHARES,
                 "counts_epochN": "(label, target) counts over the DRAW batches in epoch N (0: get_rand_target)",
                 "one, two": "a batch of labels 0..7 whose first draw is served, with one / two draws equal to "
                             "their labels: the code's y_t"}
    return {"fairtat": (step(path, inp), step_meta), "fairtat_loop": (loop(path), loop_meta),
            "fairtat_draw": (draws(path), draw_meta)}
