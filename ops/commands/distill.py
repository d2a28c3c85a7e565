"""`brigade distill`: from the model Brigade serves to a faster student it can serve.

    teacher answers (corpus) -> student from evenly spaced teacher layers -> training on the
    blueprint's loss -> a model folder, registered as NAME@VERSION -> distill-report.json + PNG

Everything lives in the work folder (`--work`, default BRIGADE_HOME/distill/NAME@VERSION):
`student/` (the model), `checkpoint/`, `ablation/` (the α = 1 run with `--ablation`), the report
and the plot. The corpus is kept apart (BRIGADE_HOME/distill/corpus-*) and shared by every run
with the same teacher, prompts and sampling.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ops.commands.cli_options import add_connection_options
from ops.core import redis_clients
from ops.rollout import registry
from ops.rollout.registry import RegistryError
from ops.core.settings import Settings, get_settings, torch_threads

log = logging.getLogger("brigade.distill")
DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "distill_prompts.jsonl"
HELD_OUT_SHARE = 0.1
ABLATION = {"alpha": 1.0, "temperature": 1.0}  # hard labels only: fine-tuning on the teacher's answers


class DistillError(ValueError):
    """A mistake the user can fix, said in one line."""


def _teacher(settings: Settings, ref: str) -> tuple[Path, str, dict]:
    """The teacher's folder, its identity (checksum) and its sampling defaults."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        return folder, str(folder.resolve()), {}
    name, version = registry.split_ref(ref)
    snap = registry.read_snapshot(redis_clients.client(settings.redis_url))
    version = version or snap.stable.get(name, "")
    entry = snap.entry(name, version)
    if entry is None:
        known = ", ".join(e.ref for n in sorted(snap.models) for e in snap.versions(n)) or "none"
        raise DistillError(f"teacher {ref} is not registered (registered: {known}); brigade models add ...")
    local = registry.local_folder(entry, settings.store_dir)
    if local is None:
        raise DistillError(f"{entry.ref} is not on this machine: brigade models pull {entry.ref} --from SHARED")
    return local, entry.checksum, dict(entry.generation)


def _progress(total_steps: int | None, minutes: float | None, label: str):
    """A rich bar (loss terms, tok/s, time left) on a terminal; a log line every 30 s otherwise."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        bar = Progress(TextColumn(f"distill {label}"), BarColumn(), TextColumn("{task.description}"),
                       TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
        bar.start()
        task = bar.add_task("", total=total_steps or (minutes or 1) * 60)
    else:
        bar = task = None
    last = [0.0]

    def on_step(state, row) -> None:
        text = f"step {row['step']} loss {row['loss']:.3f} hard {row['hard']:.3f} kl {row['kl']:.3f} {row['tok_s']:.0f} tok/s"
        if bar is not None:
            bar.update(task, completed=state.step if total_steps else state.elapsed_s, description=text)
        elif time.monotonic() - last[0] >= 30:
            last[0] = time.monotonic()
            share = max(state.step / total_steps if total_steps else 0, state.elapsed_s / (minutes * 60) if minutes else 0)
            left = state.elapsed_s / share - state.elapsed_s if share else 0
            print(f"distill {label} {text} left_s={left:.0f}", file=sys.stderr, flush=True)

    def stop() -> None:
        if bar is not None:
            bar.stop()

    return on_step, stop


def _train(teacher, config_of_student, examples, train_config, folder: Path, pad_id: int, resume: bool,
           restart: bool, label: str):
    from ops.training.distill.student import build_student
    from ops.training.distill.trainer import Trainer

    student, plan = build_student(teacher, config_of_student)
    on_step, stop = _progress(train_config.steps, train_config.minutes, label)
    trainer = Trainer(teacher, student, examples, train_config, folder, pad_id, on_step)
    if resume and not trainer.resume():
        print(f"distill: no checkpoint in {folder}; starting from the teacher's layers", file=sys.stderr)
    try:
        state = trainer.run()
    finally:
        stop()
    return student, plan, state


def run(args, settings: Settings | None = None) -> int:
    settings = settings or get_settings()
    try:
        return _run(args, settings)
    except (DistillError, RegistryError, ValueError) as exc:
        print(f"brigade distill: {exc}", file=sys.stderr)
        return 2


@dataclass
class Teacher:
    """The model distilled from, loaded once: its folder, identity (checksum), sampling defaults."""

    folder: Path
    identity: str
    generation: dict
    model: object  # a transformers causal LM, float32, on the run's device
    tokenizer: object
    pad_id: int


def _run(args, settings: Settings) -> int:
    """corpus -> student(s) trained -> registered -> report; each step below, in this order."""
    import torch

    from engine.model_files import offline

    offline()
    _check_flags(args)
    name, version = registry.split_ref(args.out)
    work = Path(args.work).expanduser() if args.work else settings.home / "distill" / f"{name}@{version}"
    _refuse_an_earlier_run(args, work)
    threads = torch_threads(settings)
    if threads:
        torch.set_num_threads(threads)
    device = "cuda" if args.device == "cuda" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DistillError("--device cuda, but torch sees no GPU here (torch.cuda.is_available() is False)")
    work.mkdir(parents=True, exist_ok=True)
    teacher = _load_teacher(settings, args.teacher, device)
    config = _student_shape(args, teacher)
    spec, corpus, corpus_s = _teacher_answers(args, settings, teacher, device)
    train, held_out = corpus.train(), corpus.held_out()
    print(f"distill corpus {corpus.folder}: {len(train)} training and {len(held_out)} held-out answers",
          file=sys.stderr)
    runs = _students(args, teacher, config, train, work)
    registered = _register(args, settings, runs["trained"][0])
    report = _report(args, settings, teacher, config, device, held_out, runs, registered)
    report["corpus"] = {"folder": str(corpus.folder), "spec": asdict(spec), "train_answers": len(train),
                        "held_out_answers": len(held_out), "train_tokens": sum(len(e.answer_ids) for e in train),
                        "seconds_this_run": round(corpus_s, 1)}
    report["runs"] = {label: cfg for label, (_, cfg, _) in runs.items()}
    trained, hard = report["models"].get("trained"), report["models"].get("hard_only")
    if trained and hard:
        report["soft_beats_hard_on_perplexity"] = trained["perplexity"]["perplexity"] < hard["perplexity"]["perplexity"]
    _write_report(report, runs, work)
    return 0


def _check_flags(args) -> None:
    """What the flags must say before any work starts."""
    name, version = registry.split_ref(args.out)
    if not version:
        raise DistillError(f"--out needs a version: {name}@v1")
    if args.student_layers is None and args.student_config is None:
        raise DistillError("give --student-layers K or --student-config FILE")
    if not args.eval_only and args.steps is None and args.minutes is None:
        raise DistillError("give --steps N or --minutes M (or --eval-only)")


def _load_teacher(settings: Settings, ref: str, device: str) -> Teacher:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, identity, generation = _teacher(settings, ref)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Teacher(folder, identity, generation, model, tokenizer, pad_id)


def _student_shape(args, teacher: Teacher):
    """The student's transformers config, refused before any work when it cannot be built."""
    from ops.training.distill.student import check_vocabulary, evenly_spaced, student_config

    config = student_config(teacher.model.config, args.student_layers,
                            Path(args.student_config) if args.student_config else None)
    check_vocabulary(teacher.tokenizer, None, teacher.model.config.vocab_size, config.vocab_size)
    if args.student_layers is not None:
        evenly_spaced(teacher.model.config.num_hidden_layers, args.student_layers)  # refuses K out of range
    return config


def _teacher_answers(args, settings: Settings, teacher: Teacher, device: str):
    """The teacher's answers, generated by the engine in batches, once per (teacher, prompts,
    sampling): (the corpus's spec, the corpus, seconds this run spent on it)."""
    from engine import Engine, EngineConfig
    from ops.training.distill.corpus import CorpusSpec, build_corpus, prompts_sha256, read_prompts

    prompts = read_prompts(Path(args.prompts))
    generation = teacher.generation
    spec = CorpusSpec(teacher=teacher.identity, prompts_sha256=prompts_sha256(Path(args.prompts)),
                      max_tokens=args.max_tokens, temperature=float(generation.get("temperature", 1.0)),
                      top_p=float(generation.get("top_p", 1.0)), seed=args.seed, held_out_share=HELD_OUT_SHARE)
    engine = Engine(teacher.model, teacher.tokenizer, EngineConfig(
        model=str(teacher.folder), max_batch=64, max_wait_ms=0, device=device, dtype="float32",
        kv_budget_tokens=16_384, kernel_dir=settings.kernel_dir, grid_dir=settings.grid_dir))
    started = time.monotonic()
    corpus = build_corpus(engine, prompts, spec, settings.home / "distill",
                          on_done=lambda done, total: print(f"distill corpus {done}/{total} prompts answered",
                                                            file=sys.stderr, flush=True))
    return spec, corpus, time.monotonic() - started


def _run_folders(args, work: Path) -> list[tuple[str, Path, dict]]:
    """Each student's run: its label, its folder (checkpoint and student), its training overrides."""
    return [("trained", work, {})] + ([("hard_only", work / "ablation", ABLATION)] if args.ablation else [])


def _refuse_an_earlier_run(args, work: Path) -> None:
    """Before the teacher is loaded: a checkpoint already there is continued or replaced only when asked."""
    if args.eval_only or args.resume or args.restart:
        return
    for _, folder, _ in _run_folders(args, work):
        if (folder / "checkpoint" / "state.json").exists():
            raise DistillError(f"{folder} holds a checkpoint of an earlier run: --resume to continue it or --restart")


def _students(args, teacher: Teacher, config, train, work: Path) -> dict[str, tuple[Path, dict, list]]:
    """Each student trained (the α = 1 ablation too, with --ablation), or with --eval-only the
    ones an earlier run left: label -> (student folder, train config, loss history)."""
    from ops.training.distill.history import summary
    from ops.training.distill.trainer import RunState, TrainConfig, save_student

    runs: dict[str, tuple[Path, dict, list]] = {}
    for label, folder, overrides in _run_folders(args, work):
        out = folder / "student"
        if args.eval_only:
            if not (out / "config.json").exists():
                raise DistillError(f"--eval-only: no trained student in {out}; run without --eval-only first")
            state_file = folder / "checkpoint" / "state.json"
            saved = json.loads(state_file.read_text()) if state_file.exists() else None
            if saved is None:
                runs[label] = (out, {}, [])
                continue
            state = RunState(**saved["run"])
            runs[label] = (out, {**saved["config"], "summary": summary(state)}, state.history)
            continue
        cfg = TrainConfig(**{"temperature": args.temperature, "alpha": args.alpha, "steps": args.steps,
                             "minutes": args.minutes, "batch_size": args.batch_size,
                             "learning_rate": args.learning_rate, "seed": args.seed, **overrides})
        student, plan, state = _train(teacher.model, config, train, cfg, folder, teacher.pad_id, args.resume,
                                      args.restart, label)
        save_student(student, teacher.folder, out, grid=not args.float32_student)
        runs[label] = (out, {**asdict(cfg), "summary": summary(state)}, state.history)
        del student
    return runs


def _register(args, settings: Settings, student_folder: Path) -> str | None:
    """The trained student registered as --out (unless --eval-only or --no-register): its ref."""
    if args.eval_only or args.no_register:
        return None
    from ops.rollout.model_store import add_model

    entry, said = add_model(redis_clients.client(settings.redis_url), settings, args.out, student_folder,
                            replace=args.replace)
    print(f"distill: {said}", file=sys.stderr)
    return entry.ref if entry else None


def _report(args, settings: Settings, teacher: Teacher, config, device: str, held_out, runs: dict,
            registered: str | None) -> dict:
    """Teacher, untrained student and trained student(s), measured side by side."""
    import torch
    from transformers import AutoModelForCausalLM

    from ops.bench.distill import candidate, evaluate
    from ops.training.distill.student import build_student

    untrained, plan = build_student(teacher.model, config)
    candidates = [candidate("teacher", teacher.model, teacher.tokenizer, str(teacher.folder), device, settings),
                  candidate("untrained", untrained, teacher.tokenizer, str(teacher.folder), device, settings)]
    for label, (folder, _, _) in runs.items():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
        candidates.append(candidate(label, model, teacher.tokenizer, str(folder), device, settings))
    report = evaluate(candidates, held_out, teacher.pad_id, args.quality_questions, args.speed_repeats)
    report.update({
        "teacher": args.teacher, "student": args.out, "registered": registered, "command": sys.argv[1:],
        "student_shape": {"layers": config.num_hidden_layers, "layer_sources": list(plan.layer_sources),
                          "fresh_tensors": list(plan.fresh)},
    })
    return report


def _write_report(report: dict, runs: dict, work: Path) -> None:
    """distill-report.json and distill-losses.png in the work folder; their paths and the headline
    figures on stdout."""
    from ops.training.distill.history import plot_losses

    (work / "distill-report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_losses({label: history for label, (_, _, history) in runs.items() if history}, work / "distill-losses.png")
    print(json.dumps({"report": str(work / "distill-report.json"), "plot": str(work / "distill-losses.png"),
                      "gap_closed": report["gap_closed"], "gap_closed_nats": report["gap_closed_nats"],
                      "perplexity": {k: v["perplexity"]["perplexity"] for k, v in report["models"].items()},
                      "decode_tok_s": {k: v["decode_tok_s"] for k, v in report["models"].items()}}, indent=2))


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    return parse


def _share(text: str) -> float:
    value = _positive(float)(text) if text.strip() not in ("0", "0.0") else 0.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("distill", help="train a faster student from a served model with the teacher's soft labels, "
                                       "measure what it kept (distill-report.json), register it as a new version")
    p.add_argument("--teacher", required=True, help="NAME[@VERSION] in the registry (or a model folder)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--student-layers", type=_positive(int), metavar="K",
                       help="K decoder layers, started from evenly spaced teacher layers")
    shape.add_argument("--student-config", metavar="FILE", help="a Llama config.json for the student instead of K")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS),
                   help="JSONL of {\"messages\": [...]} or {\"prompt\": ...} (default: 1,000 shipped questions)")
    p.add_argument("--out", required=True, metavar="NAME@VERSION", help="the student's name and version in the registry")
    p.add_argument("--temperature", type=_positive(float), default=2.0, help="T of the loss (default 2)")
    p.add_argument("--alpha", type=_share, default=0.5, help="weight of the hard-label term (default 0.5)")
    p.add_argument("--steps", type=_positive(int), help="optimizer steps")
    p.add_argument("--minutes", type=_positive(float), help="training time")
    p.add_argument("--max-tokens", type=_positive(int), default=64, help="longest teacher answer (default 64)")
    p.add_argument("--batch-size", type=_positive(int), default=8, help="answers per step (default 8)")
    p.add_argument("--learning-rate", type=_positive(float), default=3e-4, help="peak AdamW rate (default 3e-4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--resume", action="store_true", help="continue from the work folder's checkpoint")
    p.add_argument("--restart", action="store_true", help="ignore an earlier checkpoint and start over")
    p.add_argument("--ablation", action="store_true", help="also train an α = 1, T = 1 student (hard labels only) "
                                                            "with the same budget, for the report")
    p.add_argument("--eval-only", action="store_true", help="only write the report, for students already trained")
    p.add_argument("--quality-questions", type=_positive(int), help="how many of bench quality's questions (default all)")
    p.add_argument("--speed-repeats", type=_positive(int), default=3, help="runs of each decode-speed row (default 3)")
    p.add_argument("--work", help="work folder (default BRIGADE_HOME/distill/NAME@VERSION)")
    p.add_argument("--no-register", action="store_true", help="leave the registry alone")
    p.add_argument("--float32-student", action="store_true",
                   help="save the trained weights as they are (default: put on GGUF's 4-bit grid, as the "
                        "default model's are, and served from it exactly: about 2x the decode speed)")
    p.add_argument("--replace", action="store_true", help="register over an existing NAME@VERSION")
    add_connection_options(p, redis="redis_url")
    p.set_defaults(fn=lambda args: run(args))
    return p
