"""Where one micro-batch's time goes inside the layers: every kind of layer a model has (the same terms, the same
bounds), term by term, with what binds its attention core. `megapilot estimate --layers` prints it; it reads the
step time's own `layer_terms`, so its terms are the ones the estimate sums."""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.estimate.attention_bounds import PassBounds, attention_pass_bounds
from megapilot.estimate.cases import Case
from megapilot.estimate.step_time import layer_terms

TERM_DIGITS = 12  # layers whose terms agree to a picosecond are one kind


@dataclass(frozen=True)
class LayerGroup:
    """Layers that cost the same: their indices, one micro-batch's seconds term by term (forward + backward, no
    recompute), and their attention core's bound (None: no softmax attention, e.g. a Mamba or Gated DeltaNet layer)."""

    layers: tuple[int, ...]
    terms_s: dict[str, float]
    attention: PassBounds | None

    @property
    def total_s(self) -> float:
        return sum(self.terms_s.values())

    def to_json(self) -> dict[str, object]:
        bound = self.attention
        return {"layers": list(self.layers), "terms_ms": {k: round(v * 1e3, 4) for k, v in self.terms_s.items()},
                "total_ms": round(self.total_s * 1e3, 4),
                "attention_bound": None if bound is None else {
                    "forward": round(bound.forward, 4), "backward": round(bound.backward, 4),
                    "backward_by": bound.backward_by}}


def layer_groups(case: Case) -> tuple[LayerGroup, ...]:
    """Every kind of decoder layer of the case's model, in the order its first layer comes."""
    model = case.model
    members: dict[tuple[object, ...], list[int]] = {}
    first: dict[tuple[object, ...], LayerGroup] = {}
    for index in range(model.num_layers):
        terms = {k: v for k, v in layer_terms(model, index, case.cluster, case.training, case.parallel, case.options,
                                              recomputed=False).items() if v}
        bound = _attention_bound(case, index)
        key = (tuple((k, round(v, TERM_DIGITS)) for k, v in terms.items()), bound)
        first.setdefault(key, LayerGroup((), terms, bound))
        members.setdefault(key, []).append(index)
    return tuple(LayerGroup(tuple(members[key]), group.terms_s, group.attention) for key, group in first.items())


def _attention_bound(case: Case, index: int) -> PassBounds | None:
    if not case.model.has_softmax_core(index):
        return None
    return attention_pass_bounds(case.model, index, case.cluster.gpu)
