"""Policy: what a DatabaseInstance may ask for before anything is sent to a provider. Both modules are pure
decisions checked on every pass: ``guardrails`` (the DatabaseClass's rules: sizes, region, networks) and
``capability`` (which set fields the chosen provider cannot honour, named in the Unsupported condition). The step
that acts on them is the reconciler's (conditions, no provider call)."""
