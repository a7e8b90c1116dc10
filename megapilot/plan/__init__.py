"""Parallel-layout planning: search, constraints, ranking and the reasons a layout won or lost.

`plan(model, cluster, training, top=5, pins=Pins(...))` → `PlanResult` (ranked `Candidate`s with their
estimates and reasons, rejection counts, runner-up summary, `to_saved_plan()`). All numbers come
from `megapilot.estimate`; this package owns the search, never a cost formula. Layouts predicted within
the estimator's measured error of the fastest are ordered by the public recipes' preferences
(`megapilot.plan.preferences`), and the winner's reasons say when that changed the order.
"""

from megapilot.plan.cost import CostModel
from megapilot.plan.planner import DEFAULT_TOP, plan
from megapilot.plan.reasons import layout_label
from megapilot.plan.search import Candidate, PlanResult, search_layouts
from megapilot.plan.space import Pins

__all__ = ["DEFAULT_TOP", "Candidate", "CostModel", "Pins", "PlanResult", "layout_label", "plan", "search_layouts"]
