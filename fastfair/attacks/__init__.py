"""Attacks: the one PGD engine (training and evaluation), attacks by name, and AutoAttack."""
from fastfair.attacks.names import EvalAttack, parse_attack
from fastfair.attacks.pgd import PGD, attack_mode, per_class

__all__ = ["PGD", "EvalAttack", "attack_mode", "parse_attack", "per_class"]
