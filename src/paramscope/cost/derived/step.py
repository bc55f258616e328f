"""One model's derived recipes under one set of settings: read from the cache, or derived and kept, a regime at a
time as questions reach it (memory/training.py asks; derive.py derives; store.py keeps)."""

from __future__ import annotations

from typing import Any

from .derive import batch_range_of, derive_training, regime_of, seq_unit_of
from .recipe import DerivedPeaks, DerivedRecipe
from .symbols import NotDerivable


class DerivedStep:
    """One model's recipes under one set of settings, a recipe per regime: read from the cache, or derived when a
    question first reaches its regime (a largest batch or context searched across them) and kept."""

    def __init__(self, module: Any, class_name: str, config: Any, settings: Any, limit: int | None,
                 live: bool = False, structure: str | None = None) -> None:
        self.module, self.class_name, self.config = module, class_name, config
        self.settings, self.limit = settings, limit
        # a live module (a PEFT plan, a user's half-frozen model) is more than its config: its structure is keyed,
        # by the caller's key where it has one (a plan's: the config and the plan's options, known without a build)
        self.structure = structure or (structure_of(module) if live and module is not None else None)
        self.recipes: list[DerivedRecipe] = []
        self.declined: list[str] = []  # why each regime that declined did
        self.declined_regimes: set[tuple[tuple[int, int], tuple[int, int]]] = set()  # (B range, S range)
        self.from_cache = 0

    @classmethod
    def first(cls, module: Any, class_name: str, config: Any, settings: Any, *, batch: int, seq: int,
              limit: int | None, live: bool = False, fresh: bool = False,
              structure: str | None = None) -> "DerivedStep | None":
        """The step with the asked point's recipe; None when it is not cached and there is no module to trace
        (NotDerivable when the derivation declines). `fresh`: the asked point's recipe is derived, and checked by a
        trace at that point, even where the cache holds it."""
        step = cls(module, class_name, config, settings, limit, live, structure)
        recipe = step._recipe(batch, seq, fresh=fresh)
        if recipe is None:
            return None
        step.recipes.append(recipe)
        return step

    def _recipe(self, batch: int, seq: int, fresh: bool = False) -> DerivedRecipe | None:
        from .store import find_recipe, keep_recipe, recipe_key

        seq_range, _ = regime_of(self.config, seq, self.limit)
        key = recipe_key(self.class_name, self.config, self.settings, batch, seq_range, self.structure)
        recipe = None if fresh and self.module is not None else find_recipe(self.class_name, key)
        if recipe is not None:
            self.from_cache += 1
            return recipe
        if self.module is None:
            return None
        recipe = derive_training(self.module, self.settings, seq=seq, batch=batch, max_context=self.limit)
        keep_recipe(self.class_name, key, recipe)
        return recipe

    @property
    def recipe(self) -> DerivedRecipe:
        """The asked batch and length's recipe (the first)."""
        return self.recipes[0]

    def at(self, batch: int, seq: int) -> DerivedPeaks | None:
        """The figures at `batch` × `seq`; None where that regime's derivation declines (or needs a build)."""
        for recipe in self.recipes:
            if recipe.covers(batch, seq):
                return recipe.peaks(batch, seq)
        if seq % seq_unit_of(self.settings, self.config):  # sequence parallelism (a length the ranks cannot split
            # evenly) or an expert load's unit (a length where the busiest rank's pairs round up)
            return None
        regime = (batch_range_of(batch), regime_of(self.config, seq, self.limit)[0])
        if regime in self.declined_regimes:  # tried once: not again
            return None
        try:
            recipe = self._recipe(batch, seq)
        except NotDerivable as err:
            recipe, why = None, str(err)
        else:
            why = "not cached; it needs the build" if recipe is None else ""
        if recipe is None:
            self.declined.append(f"B={batch}, S={seq}: {why}")
            self.declined_regimes.add(regime)
            return None
        self.recipes.append(recipe)
        return recipe.peaks(batch, seq)

    def notes(self) -> list[str]:
        recipe = self.recipe
        cached = " (read from the cache: derived and checked by an earlier run)" if self.from_cache else ""
        return [f"derived{cached}: {recipe.traced}; {recipe.check}",
                f"derived regime: {recipe.regime}; another batch or length in it is answered from the closed form, "
                "another regime is derived when first asked"]


def structure_of(module: Any) -> str:
    """A digest of a module's structure: every parameter's name, shape, dtype and whether it trains, and every
    module's class (a PEFT plan's rank, targets and frozen base, QLoRA's stand-ins)."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}:{param.requires_grad};".encode())
    for name, sub in module.named_modules():
        digest.update(f"{name}:{type(sub).__module__}.{type(sub).__name__};".encode())
    return digest.hexdigest()[:32]
