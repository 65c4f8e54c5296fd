"""Methods without public code: each paper's equation evaluated independently in float64.

Nothing here imports fastfair: every quantity is written from the paper's text (the ME paper,
Tian et al. KDD 2021 and ICLR sub., Pang et al. 2020, Benz et al. 2021, Szegedy et al. 2016) in
numpy or plain float64 torch, on the fixed inputs of ``conformance.inputs()`` (TinyNet and its 64
images, run in float64). ``make.py`` passes ``path=None`` (no repository); each array's source is
``meta["sources"][name]["reference"]``.

The adversarial point ``x_adv`` is not any method's attack (the papers use the standard ones,
checked elsewhere): a fixed point 8/255 from x, on the 1/255 grid so that it is stored exactly as
uint8, at which every loss below is evaluated.
"""
import math

import numpy as np
import torch

FLOAT64 = []  # every equation is evaluated in float64 already
REPO = None  # no public code: the references are the papers' equations
PINNED = None

C = 10
EPS_I, ALPHA_I = 8, 2  # x_adv: 5 CE sign steps of 2/255 in the 8/255 ball, all in integer units of 1/255
POOL_TIE = 2e-6  # float32 rounding of a 27-term conv sum + BN: <= ~27 x 6e-8 of the layer's largest activation
SIGN_NOISE = 1e-4  # conformance.SIGN_NOISE: a gradient element this small (of its sample's max) has no sure sign
SIGN_NOISE64 = SIGN_NOISE * 2.0 ** -29  # conformance.sign_noise() in float64: the same sums at float64's unit

SETTINGS = {
    "me_at": {"beta": 0.5},  # ME paper Table 3, ME-AT (beta = 0.5)
    "me_trades": {"lambda": 27.0, "beta": 1.0},  # ME paper Table 2, ME-TRADES (beta = 1, lambda = 27)
    "ls": {"alpha": 0.1, "trades_lambda": 6.0},  # ME paper Table 1: LS alpha = 0.1 with PGD-AT and TRADES
    "classwise_beta": {"beta": [6.0, 6.0, 6.0, 6.0, 6.0, 0.5, 6.0, 6.0, 6.0, 6.0]},  # Tian KDD Fig. 4(c) '66666X6666'
    "he_at": {"s": 10.0, "m": 0.2},  # Pang et al. 2020's PGD-HE (preset tian-iclr-t5-he)
    "he_trades": {"s": 15.0, "m": 0.2, "lambda": 6.0},  # Pang et al. 2020's TRADES-HE
    "lis": {"inv_t0": 1.0, "inv_tfi": 75.0, "n_fi": 100},  # Tian ICLR App. G
    "cmp": {"p0": 0.2, "pfi": 1.0, "n_fi": 90, "n_tot": 100},  # Tian ICLR App. G
    "tpgd": {"inverse_t": [1, 2, 5, 10, 50], "eps": EPS_I / 255, "alpha": ALPHA_I / 255},  # Tian KDD Sec. 5 grid
    "cost_sensitive": {"weights": [1.0, 0.8, 1.3, 1.9, 1.4, 1.2, 0.9, 0.9, 0.8, 0.7]},  # made up
}

ME = "ME paper (ICLR 2022 sub.), Sec. 3.2.1"
TIAN_ICLR = "Tian et al. (ICLR 2021 sub.)"
TIAN_KDD = "Tian et al. KDD 2021"
PANG = "Pang et al. 2020 (NeurIPS), Sec. 3: FN + WN, L_CE^m = CE(s (cos - m 1_y), y)"
SOURCES = {
    "x_adv_uint8": "fixed point: 5 CE sign steps (2/255, ball 8/255, eval BN) from x, in float64",
    "me_at.rows": f"{ME}, L_ME-AT = CE(x', y) - beta H(p(x'))",
    "me_at.weight_grad": f"{ME}, L_ME-AT (sum_i keep_i rows_i / N), d/dtheta",
    "me_trades.rows": f"{ME}, L_ME-TRADES = CE(x, y) - (lambda + beta) H(p(x)) - lambda sum_i p(x)_i log p(x')_i",
    "me_trades.rows_concise": f"{ME}, L_ME-TRADES = CE(x, y) + lambda KL(p(x) ‖ p(x')) - beta H(p(x))",
    "me_trades.weight_grad": f"{ME}, L_ME-TRADES (sum_i keep_i rows_i / N), d/dtheta",
    "ls_at.rows": "Szegedy et al. 2016, Sec. 7: CE against (1 - a) onehot + a / K; ME paper Table 1 (PGD-AT+LS)",
    "ls_at.weight_grad": "Szegedy et al. 2016, Sec. 7 (PGD-AT+LS, sum_i keep_i rows_i / N), d/dtheta",
    "ls_trades.rows": "Szegedy et al. 2016, Sec. 7 on TRADES' CE(x, y); ME paper Table 1 (TRADES+LS)",
    "classwise_beta.rows": f"{TIAN_KDD}, Eq. 5: CE(x, y) + beta_y KL(p(x) ‖ p(x'))",
    "classwise_beta.weight_grad": f"{TIAN_KDD}, Eq. 5 (sum_i keep_i rows_i / N), d/dtheta",
    "he.logits": f"{TIAN_ICLR}, App. G, Eq. 3: s W~_i^T z~ (FN + WN; {PANG})",
    "he_at.rows": f"{PANG}, on x' (PGD-HE)",
    "he_at.weight_grad": f"{PANG}, on x' (PGD-HE, sum_i keep_i rows_i / N), d/dtheta",
    "he_trades.rows": f"{PANG} on x + lambda KL(S(s cos(x)) ‖ S(s cos(x'))) (TRADES-HE)",
    "lis.scale": f"{TIAN_ICLR}, App. G, Eq. 5 (n = 0 .. n_tot - 1, as Eq. 6 counts)",
    "cmp.target": f"{TIAN_ICLR}, App. G, Eq. 6",
    "cmp.scale": f"{TIAN_ICLR}, App. G, Eq. 3 and 6: s with max_l S(s W~^T W~_l)_l = P^max_n (bisection)",
    "tpgd.p_true": f"{TIAN_KDD}, Eq. 3: S(f(x)/T)_y at the fixed point",
    "tpgd.direction": f"{TIAN_KDD}, Eq. 3-4 (ICLR sub. Eq. 1-2): sign grad_x CE(S(f(x)/T), y); "
                      "+-2: float32 noise, +-3: float64 noise too",
    "grad_keep": "samples without a max-pool near-tie in the train-mode forwards of x and x_adv (the weight "
                 "gradients are of sum_i keep_i rows_i / N)",
    "tpgd.pool_tie": "samples with a max-pool window whose top two inputs are within 2e-6 of the layer's largest "
                     "activation at the fixed point (float32 may route the gradient to the other one)",
    "cs.objective": "Benz et al. 2021, Sec. 3.3 (cost-sensitive: class weight w_y on each sample's loss; no equation)",
    "cs.acc": "made-up per-class train robust accuracies (%), one row per epoch",
    "cs.auto_weights": "fastfair's rule w_k = (1 - A_k) / mean_j (1 - A_j) (docs/methods.md; Benz et al. give none)",
    "measures.acc": "made-up per-class accuracies (%)",
    "measures.cv": f"{TIAN_KDD}, Def. 4.1: CV = (1/C) sum_c (a_c - mean a)^2",
    "measures.mcd": f"{TIAN_KDD}, Def. 4.2: MCD = a_max - a_min",
    "table1.acc": f"{TIAN_KDD}, Table 1, PGD rows (Madry, TRADES, MART, HE): per-class robustness as printed",
    "table1.cv": f"{TIAN_KDD}, Table 1, PGD rows: CV as printed",
    "table1.mcd": f"{TIAN_KDD}, Table 1, PGD rows: MCD as printed",
}

# Tian et al. KDD 2021, Table 1, the four PGD rows (classes 0-9, CV, MCD), typed from the paper.
TABLE1_PGD = [
    ([63.8, 71.6, 39.1, 25.3, 36.7, 38.6, 57.4, 59.5, 63.1, 66.8], 224.3, 46.3),
    ([67.8, 80.6, 37.8, 29.4, 40.6, 43.9, 59.3, 66.9, 71.8, 65.6], 263.6, 51.1),
    ([64.5, 78.0, 45.1, 35.4, 37.7, 43.5, 65.3, 67.5, 76.3, 69.5], 235.1, 42.6),
    ([64.9, 79.3, 41.0, 34.5, 47.9, 51.5, 67.6, 70.5, 76.9, 73.2], 224.8, 44.8),
]


# -- the paper's quantities, from logits (float64) -------------------------------------------

def log_softmax(z):
    return z - torch.logsumexp(z, dim=1, keepdim=True)


def onehot(y):
    return torch.nn.functional.one_hot(y, C).double()


def ce(z, y, alpha=0.0):
    """CE(x, y) = -sum_i q_i log p_i, q = (1 - alpha) onehot + alpha / K (Szegedy et al. 2016, Sec. 7)."""
    q = (1.0 - alpha) * onehot(y) + alpha / C
    return -(q * log_softmax(z)).sum(1)


def entropy(z):
    """H(p) = -sum_i p_i log p_i (ME paper, Sec. 3.2.1)."""
    logp = log_softmax(z)
    return -(logp.exp() * logp).sum(1)


def kl(z_nat, z_adv):
    """KL(p(x) || p(x')) = sum_i p(x)_i log p(x)_i - sum_i p(x)_i log p(x')_i (ME paper, Sec. 3.2.1)."""
    lp, lq = log_softmax(z_nat), log_softmax(z_adv)
    return (lp.exp() * (lp - lq)).sum(1)


def cosine_logits(features, weight, s):
    """s W~^T z~ with z~ = z / ||z||_2 and W~_i = W_i / ||W_i||_2 (Tian ICLR App. G, Eq. 3; Pang et al. FN + WN)."""
    zt = features / features.norm(dim=1, keepdim=True)
    wt = weight / weight.norm(dim=1, keepdim=True)
    return s * zt @ wt.T


# -- the model, in float64 -------------------------------------------------------------------

def nets(inp):
    """A fresh float64 TinyNet per use: a train-mode forward moves BN's running statistics."""
    return lambda mode="train": inp.model(mode).double()


def wgrad(loss, params):
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.flatten() for g in grads]).numpy()


def fixed_point(net, x_u8, y):
    """5 CE sign steps in integer units of 1/255: the result lies exactly on the uint8 grid."""
    model = net("eval")
    for p in model.parameters():
        p.requires_grad_(False)
    x0 = x_u8.long()
    d = torch.zeros_like(x0)
    for _ in range(5):
        xa = ((x0 + d).double() / 255).requires_grad_(True)
        (g,) = torch.autograd.grad(ce(model(xa), y).sum(), xa)
        d = (d + ALPHA_I * g.sign().long()).clamp(-EPS_I, EPS_I)
        d = (x0 + d).clamp(0, 255) - x0
    return (x0 + d).to(torch.uint8)


def he_features(model, x):
    return model.features(x).flatten(1)


def pool_ties(model, x):
    """Per sample: does a max-pool window hold two inputs within POOL_TIE of the layer's largest value?
    (``model`` in the mode of the forward in question: train-mode BN normalises by the batch.)"""
    tie = torch.zeros(x.shape[0], dtype=torch.bool)
    h = x
    with torch.no_grad():
        for layer in model.features:
            if isinstance(layer, torch.nn.MaxPool2d):
                n, c, hh, ww = h.shape
                win = h.view(n, c, hh // 2, 2, ww // 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(n, c, -1, 4)
                top = win.topk(2, dim=-1).values
                scale = h.flatten(1).amax(1).view(n, 1, 1)
                near = (top[..., 0] > 0) & (top[..., 0] - top[..., 1] <= POOL_TIE * scale)
                tie |= near.flatten(1).any(1)
            h = layer(h)
    return tie.numpy()


def cmp_scale(target, gram):
    """Bisection in log s for max_l S(s gram[l])_l = target: each P_l grows with s, so their max does."""
    def pmax(s):
        z = s * gram
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return float((np.diag(e) / e.sum(axis=1)).max())

    lo, hi = math.log(1e-6), math.log(1e4)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if pmax(math.exp(mid)) < target else (lo, mid)
    return math.exp(0.5 * (lo + hi))


def generate(path, inp):
    assert path is None
    return {"paper": _generate(inp)}


def _generate(inp):
    net = nets(inp)
    y = inp.y
    x_u8 = (inp.x * 255).round().to(torch.uint8)
    x = x_u8.double() / 255
    xa_u8 = fixed_point(net, x_u8, y)
    xa = xa_u8.double() / 255
    out = {"x_adv_uint8": xa_u8.numpy()}
    S = SETTINGS

    # A max-pool near-tie routes a sample's gradient by float32 rounding: the weight gradients are
    # of the batch mean over the other samples (sum_i keep_i rows_i / N), ties judged in the
    # train-mode forwards of x and of x_adv that the losses below make.
    keep = ~torch.from_numpy(pool_ties(net("train"), x) | pool_ties(net("train"), xa))
    out["grad_keep"] = keep.numpy()

    def rows_and_grad(name, f):
        """f(model) -> rows; the gradient is of sum_i keep_i rows_i / N."""
        model = net("train")
        rows = f(model)
        out[f"{name}.rows"] = rows.detach().numpy()
        out[f"{name}.weight_grad"] = wgrad((rows * keep).sum() / len(rows), list(model.parameters()))
        return rows

    # ME-AT: CE(x', y) - beta H(p(x')), train-mode BN (as PGD-AT's update)
    b = S["me_at"]["beta"]
    rows_and_grad("me_at", lambda m: (lambda z: ce(z, y) - b * entropy(z))(m(xa)))

    # ME-TRADES, the paper's first form: CE(x, y) - (lambda + beta) H(p(x)) - lambda sum_i p(x)_i log p(x')_i
    lam, b = S["me_trades"]["lambda"], S["me_trades"]["beta"]

    def me_trades(m):
        z, za = m(x), m(xa)  # two forwards: BN sees the natural and the adversarial batch apart
        cross = (log_softmax(z).exp() * log_softmax(za)).sum(1)
        return ce(z, y) - (lam + b) * entropy(z) - lam * cross

    rows = rows_and_grad("me_trades", me_trades)
    m = net("train")
    z, za = m(x), m(xa)
    concise = ce(z, y) + lam * kl(z, za) - b * entropy(z)
    out["me_trades.rows_concise"] = concise.detach().numpy()
    gap = float((concise - rows).detach().abs().max())
    assert gap < 1e-10 * float(rows.detach().abs().max()), f"the paper's two ME-TRADES forms differ by {gap}"

    # label smoothing: PGD-AT+LS and TRADES+LS, alpha = 0.1
    a = S["ls"]["alpha"]
    rows_and_grad("ls_at", lambda m: ce(m(xa), y, a))
    m = net("train")
    z, za = m(x), m(xa)
    out["ls_trades.rows"] = (ce(z, y, a) + S["ls"]["trades_lambda"] * kl(z, za)).detach().numpy()

    # class-wise beta (Tian KDD Eq. 5)
    beta = torch.tensor(S["classwise_beta"]["beta"], dtype=torch.float64)[y]
    rows_and_grad("classwise_beta", lambda m: (lambda z, za: ce(z, y) + beta * kl(z, za))(m(x), m(xa)))

    # HE: the logits (eval BN, on x), PGD-HE rows and gradient (features' and class weights' parameters:
    # the cosine head has no bias), TRADES-HE rows
    s, mg = S["he_at"]["s"], S["he_at"]["m"]
    m = net("eval")
    with torch.no_grad():
        out["he.logits"] = cosine_logits(he_features(m, x), m.fc.weight, s).numpy()
    m = net("train")
    rows = ce(cosine_logits(he_features(m, xa), m.fc.weight, s) - s * mg * onehot(y), y)
    out["he_at.rows"] = rows.detach().numpy()
    params = list(m.features.parameters()) + [m.fc.weight]
    out["he_at.weight_grad"] = wgrad((rows * keep).sum() / len(rows), params)
    s, mg, lam = S["he_trades"]["s"], S["he_trades"]["m"], S["he_trades"]["lambda"]
    m = net("train")
    z = cosine_logits(he_features(m, x), m.fc.weight, s)
    za = cosine_logits(he_features(m, xa), m.fc.weight, s)
    out["he_trades.rows"] = (ce(z - s * mg * onehot(y), y) + lam * kl(z, za)).detach().numpy()

    # HE-LIS (Eq. 5) and HE-CMP (Eq. 6, then Eq. 3 solved for s on the class weights' Gram matrix)
    p = S["lis"]
    n = np.arange(p["n_fi"], dtype=np.float64)
    out["lis.scale"] = p["inv_t0"] + n / p["n_fi"] * (p["inv_tfi"] - p["inv_t0"])
    p = S["cmp"]
    n = np.arange(p["n_tot"], dtype=np.float64)
    out["cmp.target"] = np.where(n < p["n_fi"], p["p0"] + n / p["n_fi"] * (p["pfi"] - p["p0"]), 1.0)
    w = inp.state["fc.weight"].double().numpy()
    wt = w / np.linalg.norm(w, axis=1, keepdims=True)
    gram = wt @ wt.T
    out["cmp.scale"] = np.array([cmp_scale(t, gram) for t in out["cmp.target"][: p["n_fi"]]])

    # Temperature-PGD: the step direction sign grad_x CE(S(f(x_k)/T), y) at x_k = x_adv, eval BN
    m = net("eval")
    for q in m.parameters():
        q.requires_grad_(False)
    dirs, ptrue = [], []
    for inv_t in S["tpgd"]["inverse_t"]:
        xk = xa.clone().requires_grad_(True)
        zt = m(xk) * inv_t
        (g,) = torch.autograd.grad(ce(zt, y).sum(), xk)
        scale = g.flatten(1).abs().amax(1).view(-1, 1, 1, 1)
        # 1, 2 where float32 has no sure sign, 3 where float64 has none either
        level = 1.0 + (g.abs() <= SIGN_NOISE * scale).double() + (g.abs() <= SIGN_NOISE64 * scale).double()
        dirs.append((g.sign() * level).to(torch.int8).numpy())
        ptrue.append(log_softmax(zt.detach()).exp().gather(1, y[:, None]).squeeze(1).numpy())
    out["tpgd.direction"] = np.stack(dirs)
    out["tpgd.pool_tie"] = pool_ties(m, xa)
    out["tpgd.p_true"] = np.stack(ptrue)

    # cost-sensitive: a given weight vector on PGD-AT's CE rows; the auto rule on made-up accuracies
    wcs = torch.tensor(S["cost_sensitive"]["weights"], dtype=torch.float64)
    m = net("train")
    out["cs.objective"] = np.array(float((wcs[y] * ce(m(xa), y)).mean()))
    rng = np.random.default_rng(0)
    acc = np.round(rng.uniform(5, 95, size=(6, C)), 2)
    acc[3] = 100.0  # every class fully robust: no error to weight by
    acc[4, :5] = 100.0  # some classes fully robust
    out["cs.acc"] = acc
    err = 1 - acc / 100
    mean = err.mean(1, keepdims=True)
    out["cs.auto_weights"] = np.where(mean > 0, err / np.where(mean > 0, mean, 1), 1.0)

    # CV and MCD (Tian KDD Def. 4.1-4.2) on made-up accuracies, and the paper's own Table 1 rows
    acc = np.round(rng.uniform(0, 100, size=(8, C)), 2)
    acc[0] = 50.0  # all equal
    acc[1] = [100.0] + [0.0] * 9
    out["measures.acc"] = acc
    out["measures.cv"] = ((acc - acc.mean(1, keepdims=True)) ** 2).mean(1)
    out["measures.mcd"] = acc.max(1) - acc.min(1)
    out["table1.acc"] = np.array([r[0] for r in TABLE1_PGD])
    out["table1.cv"] = np.array([r[1] for r in TABLE1_PGD])
    out["table1.mcd"] = np.array([r[2] for r in TABLE1_PGD])

    assert set(out) == set(SOURCES), set(out) ^ set(SOURCES)
    meta = {"settings": SETTINGS, "sources": {k: {"reference": v} for k, v in SOURCES.items()},
            "note": "independent float64 evaluation of the papers' equations; no code shared with fastfair"}
    return out, meta
