"""FGSM adversarial training from a random start (Wong, Rice & Kolter 2020, "Fast is better than free")."""
from fastfair.errors import UserError
from fastfair.methods.at import PGDAT
from fastfair.methods.base import METHODS
from fastfair.schema import Key, PRESET, Tune, USER


@METHODS.register("fgsm-rs", "FGSM from a uniform random start, step 1.25 eps (Wong, Rice & Kolter 2020)")
class FGSMRS(PGDAT):
    """CE(f(x'), y), x' = Pi(x + delta_0 + alpha sign(grad)), delta_0 ~ U(-eps, eps), alpha = step_ratio eps
    (Wong et al. 2020, Alg. 3)."""

    keys = {"step_ratio": Key(1.25, "FGSM-RS step as a multiple of eps, alpha = step_ratio * eps (Wong et al. 2020, "
                                    "Sec. 4: 1.25; 2 and more lead to catastrophic overfitting)",
                                tune=Tune(0.5, 2.0, source="Wong et al. 2020, Sec. 4: catastrophic overfitting from "
                                                           "2; 0.5 .. 2 below it"))}
    defaults = {"attack.objective": "ce", "attack.init": "uniform", "attack.bn_mode": "train", "attack.steps": 1,
                "method.entropy_weight": 0.0}

    @classmethod
    def check(cls, cfg):
        super().check(cfg)
        a, ratio = cfg.attack, cfg.method.step_ratio
        if a.steps != 1 or a.init != "uniform":
            raise UserError(f"fgsm-rs is one step from a uniform random start (attack.steps = 1, attack.init = "
                            f"uniform); got steps {a.steps}, init {a.init!r}. For K steps use --method pgd-at")
        if ratio <= 0:
            raise UserError(f"method.step_ratio must be above 0 (Wong et al.: 1.25); got {ratio}")
        if cls._ignored_alpha(cfg) == "the command line":
            raise UserError(f"attack.alpha = {a.alpha:g} is not read by fgsm-rs, whose step is method.step_ratio x eps "
                            f"= {ratio * a.eps:g}; set method.step_ratio instead")

    @classmethod
    def warnings(cls, cfg):
        if cls._ignored_alpha(cfg) != "the preset":
            return []
        return [f"attack.alpha = {cfg.attack.alpha:g} (from the preset) is not read by fgsm-rs: its step "
                f"is method.step_ratio x eps = {cfg.method.step_ratio * cfg.attack.eps:g} (Wong et al. 2020)"]

    @staticmethod
    def _ignored_alpha(cfg) -> str:
        """Who set attack.alpha to a step fgsm-rs does not take ("the preset", "the command line"); "" when nobody
        did or it is the step taken."""
        a = cfg.attack
        if abs(a.alpha - cfg.method.step_ratio * a.eps) <= 1e-9:
            return ""
        return {PRESET: "the preset", USER: "the command line"}.get(cfg.layers.get("attack.alpha"), "")

    def __init__(self, cfg, *args, **kw):
        self.check(cfg)
        super().__init__(cfg, *args, **kw)

    def setup(self, state):
        state.add_vector("eps", self.cfg.attack.eps)
        state.add_vector("alpha", self.cfg.method.step_ratio * self.cfg.attack.eps)
        self.setup_options(state)
