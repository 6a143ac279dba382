"""Day-2 changes of a Cache's pods: a template change (version, image, resources, configuration, pod count) rolls the
pods one at a time, replicas first, with a planned switchover before the primary's turn; a scale-down never removes
the primary. :mod:`~kanri.cache.rollout.decide` says what to do (pure), :mod:`~kanri.cache.rollout.step` does it."""
