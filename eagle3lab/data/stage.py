"""One data stage (self-prompt, regenerate, extract): a typed config and one skeleton that
runs it, plan -> resume -> compute -> write -> merge ranks.

Prevents the stages drifting apart in how they run (each ordering its resume check, its
writes and its rank merge its own way), and a setting lost on the way to the code that uses
it: each stage's settings are one `StrictConfig` (`StageConfig` and its subclasses: a
typo'd or mistyped setting is one line naming it; the stage's CLI options are generated
from the fields), and `Stage.run` is the one order every stage runs in:

  plan     every rank: check the inputs, load the target (this rank's GPU or GPU group),
           derive the parameters the output records
  resume   rank 0 only, every rank gets its answer (or its error): compare with what an
           earlier run left (refuse other parameters), merge a killed run's leftovers,
           work out what is done, write the metadata file
  start    every rank: take rank 0's answer, this rank's share, the progress bar
  compute  every rank, one unit at a time (a batch, a round of batches, a shard) ...
  write    ... then write that unit (appended and fsynced, or handed to a background
           writer); `close` runs after the last unit even when interrupted (a write in
           flight is finished, files closed), so what is listed as done is complete
  merge    every rank: gather the ranks' counts, rank 0 merges their parts into the one
           output a single process writes, then the summary every rank returns

Without torchrun `session` starts no process group and every collective returns its input,
so a one-process run is the plain sequence. A loaded target (a `Target`) and the progress
bar switch are not settings: they are passed beside the config.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar, Generic, Iterable, Literal, TypeVar

from pydantic import Field, field_validator

from eagle3lab.config import DEFAULT_TARGET, PathStr, StrictConfig, cli_group
from eagle3lab.data import remote, stagerun
from eagle3lab.data.rendering import Renderer, check_chat_template, parse_template_kwargs
from eagle3lab.data.stagerun import DEFAULT_TIMEOUT_S, uses_cuda
from eagle3lab.distributed import Ranks, session
from eagle3lab.errors import UserError
from eagle3lab.targets.adapter import DEVICE_MAPS


class StageConfig(StrictConfig):
    """What every data stage takes: the target, where it runs, and on many GPUs."""

    target: PathStr = Field(DEFAULT_TARGET, description="preset name, Hugging Face model "
                            "directory, or hub id (a loaded Target is passed beside the config)")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:1, ...")
    device_map: Literal[DEVICE_MAPS] | None = Field(  # type: ignore[valid-type]
        None, description="spread the target's layers over the visible GPUs with "
        "accelerate's device map (a target larger than one GPU; instead of --device). Under "
        "torchrun each rank takes its own GPU (--device cuda or auto) or, with a device map, "
        "an equal group of its node's GPUs", json_schema_extra=cli_group("scale"))
    dist_timeout: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="under torchrun: "
                                "seconds a rank waits for the others (at the end of its "
                                "share) before the job fails",
                                json_schema_extra=cli_group("scale", metavar="SECONDS"))


class GenerationConfig(StageConfig):
    """What the stages where the target writes text take (regenerate, self-prompt): the
    model dtype, the system message, and a running server that generates instead."""

    dtype: str = Field("float32", description="model dtype (bfloat16 on GPUs)")
    system_prompt: str | None = Field(None, description="system message (default: none "
                                      "sent, so the template's default applies; \"\": an "
                                      "empty system message)")
    chat_template: PathStr | None = Field(None, description="a Jinja chat template file "
                                          "to render prompts with instead of the "
                                          "tokenizer's (recorded by sha256)",
                                          json_schema_extra=cli_group("generation",
                                                                      metavar="FILE"))
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="JSON object of template variables, e.g. "
        "'{\"enable_thinking\": false}' (passed to apply_chat_template; recorded)",
        json_schema_extra=cli_group("generation", metavar="JSON"))
    server: str | None = Field(None, description="a running server that generates (e.g. "
                               "http://127.0.0.1:30000); the target's weights are not loaded "
                               "here", json_schema_extra=cli_group("server", metavar="URL"))
    api: Literal["sglang", "openai"] = Field(
        "sglang", description="sglang: native /generate with input_ids (SGLang, eagle3lab "
        "serve); openai: /v1/completions with token ids and return_token_ids (vLLM)",
        json_schema_extra=cli_group("server"))
    concurrency: int = Field(8, ge=1, description="requests in flight",
                             json_schema_extra=cli_group("server"))
    server_model: str | None = Field(None, description="the name the server serves the "
                                     "target under, when it is not the target's (checked "
                                     "against the server's model before writing)",
                                     json_schema_extra=cli_group("server"))
    retries: int = Field(5, ge=0, description="retries per failed request (exponential "
                         "backoff from 1 s)", json_schema_extra=cli_group("server"))

    @field_validator("template_kwargs", mode="before")
    @classmethod
    def _template_kwargs(cls, v: Any) -> Any:
        return parse_template_kwargs(v, "template_kwargs (--template-kwargs)")

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, v: Any) -> Any:
        if v is not None:  # a missing file or a syntax error: before the target is loaded
            check_chat_template(v)
        return v

    def renderer(self, tokenizer, *, add_generation_prompt: bool = True) -> Renderer:
        """How this stage renders prompts (and records it): `rendering.Renderer`."""
        return Renderer(tokenizer, chat_template=self.chat_template,
                        system_prompt=self.system_prompt, template_kwargs=self.template_kwargs,
                        add_generation_prompt=add_generation_prompt)


#: The option groups of the stages' commands, in the order their help lists them.
STAGE_GROUPS: dict[str, str] = {
    "data": "what is read and written",
    "generation": "how the target writes",
    "filter": "which samples are kept",
    "aux layers": "which hidden states are captured",
    "batching": "shards and batches",
    "scale": "many GPUs (torchrun, device maps)",
    "server": "generation through a server",
}

ConfigT = TypeVar("ConfigT", bound=StageConfig)


def build_config(cls: type[ConfigT], config: ConfigT | dict[str, Any] | None, target: Any,
                 options: dict[str, Any]) -> tuple[ConfigT, Any]:
    """(the stage's config, the loaded target or None) from what a stage function was
    given: a config (or a mapping of its fields), keyword arguments (its fields; they
    override the config's), and `target`: a name or path (the config's field) or an
    already loaded target (kept beside the config, which records its path)."""
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, cls):
        data = config.model_dump()
    elif isinstance(config, dict):
        data = dict(config)
    else:
        raise UserError(f"{cls.WHERE}: expected a {cls.__name__} or a mapping of its fields, "
                        f"got {type(config).__name__}.")
    data.update(options)
    loaded = None
    if target is not None:
        if isinstance(target, (str, os.PathLike)):
            data["target"] = target
        else:
            loaded = target
            path = getattr(target, "path", None)
            if isinstance(path, (str, os.PathLike)):
                data["target"] = path
    return cls.from_dict(data, cls.WHERE), loaded


class Stage(Generic[ConfigT]):
    """The skeleton a data stage implements (the module docstring gives the order).

    Hooks: `plan`, `resume` (rank 0; returns what every rank needs), `start(state)`,
    `units` (this rank's units, lazily: a unit may depend on the writes before it),
    `compute(unit)`, `write(unit, result)`, `close`, `merge` (returns the summary).
    `device()` is where the target runs (a stage that generates through a server loads
    nothing: "cpu")."""

    CONFIG: ClassVar[type[StageConfig]]

    def __init__(self, config: ConfigT, *, target: Any = None, progress: bool = True):
        self.config = config
        #: the loaded target given beside the config, else the config's name or path
        self.target: Any = target if target is not None else config.target
        self.progress = progress
        self.ranks: Ranks | None = None
        self.bar = None
        self.t0 = 0.0

    @classmethod
    def call(cls, config: Any, *, target: Any, progress: bool,
             options: dict[str, Any]) -> dict[str, Any]:
        """What a stage function does: build the config (`build_config`) and run."""
        cfg, loaded = build_config(cls.CONFIG, config, target, options)
        return cls(cfg, target=loaded, progress=progress).run()

    def device(self) -> str:
        return self.config.device

    def run(self) -> dict[str, Any]:
        cfg = self.config
        cuda = uses_cuda(self.target, self.device(), cfg.device_map)
        with session(device="cuda" if cuda else "cpu", timeout=cfg.dist_timeout) as ranks:
            self.ranks = ranks
            self.plan()
            self.start(ranks.on_main(self.resume))
            self.t0 = time.time()
            try:
                try:
                    for unit in self.units():
                        self.write(unit, self.compute(unit))
                finally:
                    self.close()
            finally:
                if self.bar is not None:
                    self.bar.close()
            return self.merge()

    def make_bar(self, *, total: int, desc: str, unit: str, initial: int = 0):
        """The stage's progress bar (rank 0 only, and only with progress on)."""
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit,
                        disable=not (self.progress and self.ranks.main))
        return self.bar

    # --- hooks -----------------------------------------------------------------------
    def plan(self) -> None:
        raise NotImplementedError

    def resume(self) -> Any:
        raise NotImplementedError

    def start(self, state: Any) -> None:
        raise NotImplementedError

    def units(self) -> Iterable[Any]:
        raise NotImplementedError

    def compute(self, unit: Any) -> Any:
        raise NotImplementedError

    def write(self, unit: Any, result: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """After the last unit, also when interrupted (default: nothing to finish)."""

    def merge(self) -> dict[str, Any]:
        raise NotImplementedError


GenT = TypeVar("GenT", bound=GenerationConfig)


class GenerationStage(Stage[GenT]):
    """A stage where the target writes text (regenerate, self-prompt): in this process on
    this rank's device, or through a running server (`server`), which loads nothing here."""

    def device(self) -> str:
        cfg = self.config  # through a server nothing is loaded on a device
        return "cpu" if cfg.server is not None and cfg.device_map is None else cfg.device

    def load_target(self) -> tuple[Any, Any, dict[str, Any] | None]:
        """(the target, the server's generator or None, the server's identity or None):
        the server's tokenizer and config (no weights) when generating through it, else
        the target loaded on this rank's GPU (or GPU group)."""
        cfg, ranks = self.config, self.ranks
        if cfg.server is not None:
            return remote.connect(self.target, cfg.server, many_ranks=ranks.many, api=cfg.api,
                                  concurrency=cfg.concurrency, retries=cfg.retries,
                                  server_model=cfg.server_model)  # checked before writing
        return (stagerun.load_rank_target(self.target, ranks, device=self.device(),
                                          dtype=cfg.dtype, device_map=cfg.device_map),
                None, None)
