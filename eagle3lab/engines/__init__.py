"""Serving engines as eagle3lab starts and judges them: which release, which command line,
and whether the engine's own parser accepts it.

Prevents the launcher and preflight disagreeing about an engine (and importing each other
to agree): both read the release from here (`versions`), build the command from the same
`LaunchConfig` (`argv`), parse `eagle3lab serve` with the same options (`serve_args`), and
ask SGLang's own parser the same way (`sglang_parser`, which runs `sglang_check` in the
engine's interpreter). Below `preflight` and the launcher; imports nothing of either.

Modules:
- `versions`      the installed / pinned SGLang and vLLM releases, version comparison
- `argv`          `LaunchConfig` (strict) -> the exact argv of SGLang, vLLM or eagle3lab serve
- `serve_args`    `eagle3lab serve`'s own options and the `LaunchConfig` they mean
- `sglang_parser` `check_argv_with_sglang`: SGLang's `prepare_server_args` in a subprocess
- `sglang_check`  that subprocess's script (stdlib only; a stand-in triton on CPU)
"""
