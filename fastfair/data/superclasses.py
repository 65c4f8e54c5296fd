"""CIFAR-100's 20 super-classes (the data set's coarse labels) and the order that puts each one's five
classes side by side (Benz et al. 2021, Sec. 3.2: confusion and similarity of CIFAR-100 by super-class).

The mapping is data, as the data set's ``meta`` file lists it (Krizhevsky 2009, "Learning multiple layers of
features from tiny images", Sec. 3, the CIFAR-100 class table): coarse names in the order of their coarse
labels 0..19, fine names spelt as torchvision's ``CIFAR100.classes`` spells them. torchvision reads only the
fine labels, so the coarse ones live here.
"""
from __future__ import annotations

from dataclasses import dataclass

CIFAR100_SUPERCLASSES: dict[str, tuple[str, ...]] = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant", "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}


@dataclass(frozen=True)
class Block:
    """One super-class in an ordered class axis: its name and the positions ``start .. start + size - 1``."""
    name: str
    start: int
    size: int


def superclass_order(classes: list[str]) -> tuple[list[int], list[Block]] | None:
    """(order, blocks) for CIFAR-100's classes in any order: ``order`` lists the class indices super-class by
    super-class (coarse labels 0..19; within one, in the order of ``classes``), ``blocks`` the super-classes
    along it. None for any other set of class names (CIFAR-10 keeps its own order), and for a part of
    CIFAR-100, whose blocks would be uneven."""
    where = {name: k for k, name in enumerate(classes)}
    if len(classes) != len(where) or set(where) != {f for fine in CIFAR100_SUPERCLASSES.values() for f in fine}:
        return None
    order, blocks = [], []
    for coarse, fine in CIFAR100_SUPERCLASSES.items():
        blocks.append(Block(coarse, len(order), len(fine)))
        order += sorted(where[f] for f in fine)
    return order, blocks
