"""Preflight: judge a whole serving launch (engine + version + target + drafter + flags)
before a GPU is spent.

Prevents the deepest silent failure of EAGLE-3 serving, which no checkpoint check can see:
a correct drafter served by an engine build whose TARGET model class never captures aux
hidden states (accept length 1.00, fc bypassed), next to the launch-level mistakes that
cost a start on a GPU node (aux ids read elsewhere than trained, tp not dividing the heads,
a context longer than the drafter's, chain/tree settings the engine overrides).
`preflight(argv)` parses the user's real command as the engine would (command.py), resolves
the target and the drafter, runs the doctor (eagle3lab.formats) for that engine and version,
looks the target's class up in the capture tables generated from the engines' source
(capture.py, gen_capture_table.py, capture_tables/: SGLang 0.5.23, vLLM 0.25.1) and adds the
launch checks (checks.py); run.py returns a `PreflightReport` whose findings use the
doctor's `Finding` type, and which says NOT JUDGED (exit 2) when the target or the drafter
could not be resolved, instead of "OK".
"""
