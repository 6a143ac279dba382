"""Budget: the request budget every provider call pays, shared by all instances that call the same account and
region. ``buckets`` is the pure decision (a token bucket says how long to wait, never blocks); ``gateway`` is the
step every provider call goes through (pays first or is put off, pauses on throttling, counts each outcome)."""
