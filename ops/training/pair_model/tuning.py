"""The operating point (hit_rule.OperatingPoint) chosen on tune splits: recall under bounds on every look-alike.

Every look-up of the tune files is scored once (evaluation.py scores every unvetoed
candidate), then each point of the grid is replayed with numpy: for one band floor the best
proposal and its rival are fixed, and `hit_rule.passes` is a comparison of arrays.

The objective is the share of rewordings served their own answer (chat rewordings and Quora
duplicates, equally weighted) among the points whose served-wrong rates all stay under their
targets as one-sided 95% upper bounds (bounds.py), not as points: a rate of 0 of 76 look-alikes
bounds at 3.9%, so a point is only kept when the tune files hold enough of each kind to show it.
The bounds held are: chat look-alikes of all kinds together, each kind on its own (direction,
negation, entity, number, role, scope, antonym, swap, frame, act), PAWS's pairs that share almost
every word and mean something else, and paraphrase look-ups served another entry. A kept point
also serves long reworded statements their own answer at least `min_long_recall` of the time (a
point could otherwise buy Quora recall with theirs). Quora's strict precision is reported with
its lower bound, not targeted: a Quora pair labelled "not duplicate" is often a rewording of a
stored question that another pair names (docs/cache.md).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from cache.evidence import Floor
from cache.hit_rule import OperatingPoint, proposals
from ops.training.pair_model.bounds import Targets, upper_bound
from ops.training.pair_model.evaluation import LONG_WORDS, Outcome

SERVE = [round(float(x), 3) for x in np.arange(0.80, 0.995, 0.01)]
BANDS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85)
AGREES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01)  # 1.01: no band
OBJECTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95, 0.98)


@functools.lru_cache(maxsize=None)
def _bound(wrong: int, looked_up: int) -> float:
    return upper_bound(wrong, looked_up)


@dataclass
class Replay:
    """One file's look-ups at one band floor: the best proposal and its rival as arrays."""

    best_cos: np.ndarray
    best_score: np.ndarray
    best_own: np.ndarray
    rival_cos: np.ndarray
    rival_score: np.ndarray
    rival_own: np.ndarray
    duplicate: np.ndarray
    kinds: dict[str, np.ndarray]  # each kind of look-alike: which look-ups are of it (made once, read at every point)
    long: np.ndarray  # its stored text is a long statement (LONG_WORDS words or more)

    @classmethod
    def of(cls, outcomes: list[Outcome], band: float) -> "Replay":
        point = OperatingPoint(serve_cosine=1.01, band_cosine=band)
        rows = []
        for o in outcomes:
            asked = proposals(o.candidates, point) + [None, None]
            best, rival = asked[0], asked[1]
            rows.append((*_fields(best, o.own_id), *_fields(rival, o.own_id), o.duplicate))
        cols = [np.array(c) for c in zip(*rows)] if rows else [np.zeros(0)] * 7
        return cls(cols[0], cols[1], cols[2].astype(bool), cols[3], cols[4], cols[5].astype(bool),
                   cols[6].astype(bool), _kind_masks(outcomes),
                   np.array([o.words >= LONG_WORDS for o in outcomes], dtype=bool))

    def served(self, serve: float, agree: float, objection: float) -> tuple[np.ndarray, np.ndarray]:
        """hit_rule.choose for every look-up: (served anything, served its own q1)."""
        def passes(cos, score):
            return (cos >= serve) & (score >= objection) | (cos < serve) & (score >= agree)

        best, rival = passes(self.best_cos, self.best_score), passes(self.rival_cos, self.rival_score)
        from_best, from_rival = best & ~rival, rival & ~best
        return from_best | from_rival, from_best & self.best_own | from_rival & self.rival_own


def _kind_masks(outcomes: list[Outcome]) -> dict[str, np.ndarray]:
    kinds = np.array([o.kind or "" for o in outcomes])
    different = ~np.array([o.duplicate for o in outcomes], dtype=bool)
    return {str(k): (kinds == k) & different for k in sorted(set(kinds.tolist())) if k and k != "rewording"}


def _fields(c, own_id: str) -> tuple[float, float, bool]:
    if c is None:
        return -1.0, -1.0, False
    return c.cosine, c.score if c.score is not None else 1.0, c.entry_id == own_id


def measures(chat: Replay, dup: Replay | None, paws: Replay | None, para: Replay | None,
             serve: float, agree: float, objection: float) -> dict:
    """Each rate at one point, with the served-wrong counts (`*_of`: wrong, looked up) its bound needs."""
    out = {}
    served, own = chat.served(serve, agree, objection)
    different = ~chat.duplicate
    out["chat_recall"] = float((own & chat.duplicate).sum() / max(1, chat.duplicate.sum()))
    out["chat_lookalikes_of"] = (int((served & different).sum()), int(different.sum()))
    out["chat_lookalikes_served"] = out["chat_lookalikes_of"][0] / max(1, out["chat_lookalikes_of"][1])
    out["kinds_of"] = {k: (int((served & mask).sum()), int(mask.sum())) for k, mask in chat.kinds.items() if mask.any()}
    if chat.long.any():
        long_same, long_different = chat.long & chat.duplicate, chat.long & different
        out["long_recall"] = float((own & long_same).sum() / max(1, long_same.sum()))
        out["long_served_when_different"] = float((served & long_different).sum() / max(1, long_different.sum()))
    if dup is not None:
        served, own = dup.served(serve, agree, objection)
        correct = own & dup.duplicate
        out["qqp_recall"] = float(correct.sum() / max(1, dup.duplicate.sum()))
        out["qqp_precision"] = float(correct.sum() / served.sum()) if served.sum() else 1.0
    if paws is not None:
        served, _ = paws.served(serve, agree, objection)
        out["paws_of"] = (int((served & ~paws.duplicate).sum()), int((~paws.duplicate).sum()))
        out["paws_served"] = out["paws_of"][0] / max(1, out["paws_of"][1])
    if para is not None:
        served, own = para.served(serve, agree, objection)
        out["paraphrase_recall"] = float(own.mean()) if len(own) else 0.0
        out["paraphrase_wrong_of"] = (int((served & ~own).sum()), len(own))
        out["paraphrase_wrong"] = out["paraphrase_wrong_of"][0] / max(1, len(own))
    return out


def bounds_of(m: dict) -> dict:
    """The one-sided 95% upper bound of each served-wrong rate in `m` (measures' counts)."""
    out = {"chat_lookalikes": _bound(*m["chat_lookalikes_of"])}
    out.update({f"kind_{k}": _bound(*counts) for k, counts in m["kinds_of"].items()})
    if "paws_of" in m:
        out["paws"] = _bound(*m["paws_of"])
    if "paraphrase_wrong_of" in m:
        out["paraphrase_wrong"] = _bound(*m["paraphrase_wrong_of"])
    return out


def overshoot(m: dict, targets: Targets) -> float:
    """The largest bound (or the chat look-alikes' rate) over its target, or the long statements'
    recall under its own (target over rate): at most 1 when every target is kept."""
    b = bounds_of(m)
    ratios = [b["chat_lookalikes"] / targets.max_lookalikes_bound,
              m["chat_lookalikes_served"] / targets.max_lookalikes_rate,
              *(v / targets.max_kind_bound for k, v in b.items() if k.startswith("kind_")),
              b.get("paws", 0.0) / targets.max_paws_bound,
              b.get("paraphrase_wrong", 0.0) / targets.max_paraphrase_wrong_bound]
    if "long_recall" in m and targets.min_long_recall > 0:
        ratios.append(targets.min_long_recall / max(m["long_recall"], 1e-9))
    return max(ratios)


def keeps(m: dict, targets: Targets) -> bool:
    """Every bound under its target; the cheap point rates first (a rate over a target fails its bound too)."""
    if (m["chat_lookalikes_served"] > min(targets.max_lookalikes_bound, targets.max_lookalikes_rate)
            or m.get("paws_served", 0.0) > targets.max_paws_bound
            or m.get("paraphrase_wrong", 0.0) > targets.max_paraphrase_wrong_bound
            or m.get("long_recall", 1.0) < targets.min_long_recall):
        return False
    return overshoot(m, targets) <= 1.0


def _reported(m: dict) -> dict:
    """A kept point's rates and bounds, rounded, without the raw counts."""
    out = {k: round(v, 4) for k, v in m.items() if isinstance(v, float)}
    out["upper95"] = {k: round(v, 4) for k, v in bounds_of(m).items()}
    out["of"] = {"chat_lookalikes": m["chat_lookalikes_of"], **({"paws": m["paws_of"]} if "paws_of" in m else {}),
                 **{f"kind_{k}": v for k, v in m["kinds_of"].items()}}
    return out


def choose_operating_point(chat: list[Outcome], dup: list[Outcome] | None, paws: list[Outcome] | None,
                           para: list[Outcome] | None, targets: Targets = Targets()) -> tuple[OperatingPoint, dict]:
    """The point with the most rewording recall whose bounds keep every target on the tune files;
    ties go to fewer look-alikes served. None keeps them: the point whose worst bound overshoots its
    target least (the strictest on a tie), said so in the report with its bounds."""
    best, best_key, best_m = None, None, None
    closest, closest_key, closest_m = None, None, None  # when none keeps them: the least overshoot
    for band in BANDS:
        replays = [Replay.of(o, band) if o else None for o in (chat, dup, paws, para)]
        for serve in SERVE:
            if serve < band:
                continue
            for agree in AGREES:
                for objection in OBJECTIONS:
                    m = measures(*replays, serve, agree, objection)
                    if not keeps(m, targets):
                        if best is None:
                            key = (-round(overshoot(m, targets), 4), serve, agree, objection)
                            if closest_key is None or key > closest_key:
                                closest, closest_key, closest_m = OperatingPoint(serve, band, agree, objection), key, m
                        continue
                    recall = (m["chat_recall"] + m.get("qqp_recall", m["chat_recall"])) / 2
                    key = (round(recall, 4), -m["chat_lookalikes_served"], serve)
                    if best_key is None or key > best_key:
                        best, best_key, best_m = OperatingPoint(serve, band, agree, objection), key, m
    if best is None:  # the point nearest to keeping them, its bounds said; no floor below it
        return closest, {"targets_kept": False, **_reported(closest_m),
                         "floor": Floor(closest.serve_cosine, closest.agree).__dict__}
    replays = [Replay.of(o, best.band_cosine) if o else None for o in (chat, dup, paws, para)]
    return best, {"targets_kept": True, **_reported(best_m), "floor": floor_of(best, replays, targets).__dict__}


def floor_of(point: OperatingPoint, replays: list[Replay | None], targets: Targets) -> Floor:
    """How far evidence may lower each threshold (cache/evidence.py `Floor`): serve_cosine down the
    grid while every step still keeps the targets, then agree the same with serve_cosine at that
    floor (the corner both can reach together is checked, not each alone). With `objection` above
    `agree`, learning never moves serve_cosine (cache/evidence.learn: a lower one would be the
    stricter), so its floor is the trained value and agree's floor is found at it."""
    serve = point.serve_cosine
    lowerable = point.lower_serve_serves_more
    for lower in sorted((s for s in SERVE if lowerable and point.band_cosine <= s < point.serve_cosine), reverse=True):
        if not keeps(measures(*replays, lower, point.agree, point.objection), targets):
            break
        serve = lower
    agree = point.agree
    for lower in sorted((a for a in AGREES if a < point.agree), reverse=True):
        if not keeps(measures(*replays, serve, lower, point.objection), targets):
            break
        agree = lower
    return Floor(serve, agree)


def tune(settings, pair_model_path, files: dict[str, list], targets: Targets = Targets(), save: bool = True,
         calibrate: bool = True, report_test: bool = True) -> dict:
    """Fit the pair model's length calibration on the tune splits (calibration.py; `calibrate`
    False keeps the identity), score them with the pair model at `pair_model_path`, choose the
    operating point, write both into the file's info (what serving reads) and report the test splits
    (unless `report_test` is False: when choosing among several files on tune, the test splits of
    those not chosen are never looked at, and the run is shorter by their scoring).

    `files` maps a kind to its pairs: chat (rewordings and look-alikes of chat questions; their
    tune and test files are split by source question), duplicates (Quora), lookalikes (PAWS),
    paraphrases (all rewordings). Quora and PAWS are split by content (pairs.py)."""
    from cache.answer_cache import AnswerCache
    from cache.pair_model import LengthCalibration, PairModel
    from ops.training.pair_model.calibration import fit_on_pairs
    from ops.training.pair_model.evaluation import evaluate, score_pairs
    from ops.training.pair_model.pairs import split_for

    pm = PairModel.load(pair_model_path)
    overrides = {f"cache_{k}": None for k in ("serve_cosine", "band_cosine", "agree", "objection")}
    cache = AnswerCache(settings.model_copy(update=overrides), pair_model=pm, connect=False)
    tune_sets, test_sets = {}, {}
    for kind, pairs in files.items():
        if kind == "chat":
            tune_sets[kind], test_sets[kind] = pairs["tune"], pairs["test"]
            continue
        split = split_for(kind if kind == "paraphrases" else "duplicates")
        tune_sets[kind] = [p for p in pairs if split(p) == "tune"]
        test_sets[kind] = [p for p in pairs if split(p) == "test"]
    labelled = [p for kind, pairs in tune_sets.items() if kind != "paraphrases" for p in pairs]
    pm.calibration, calibrated = fit_on_pairs(pm, labelled) if calibrate else (LengthCalibration(), {})
    scored = {kind: score_pairs(cache, pairs).outcomes for kind, pairs in tune_sets.items()}
    point, tuned = choose_operating_point(scored["chat"], scored.get("duplicates"), scored.get("lookalikes"),
                                          scored.get("paraphrases"), targets)
    pm.info = {**pm.info, "operating_point": point.__dict__, "floor": tuned["floor"], "tuned": tuned,
               "targets": targets.__dict__, "calibration": pm.calibration.__dict__}
    if save:
        pm.save(pair_model_path)
    cache.pair_model = pm
    test_kinds = {"chat": "lookalikes", "duplicates": "duplicates", "lookalikes": "lookalikes",
                  "paraphrases": "paraphrases"}
    report = {"operating_point": point.__dict__, "calibration": calibrated, "tune": tuned}
    if report_test:
        for kind, pairs in test_sets.items():
            report[f"test_{kind}"] = evaluate(cache, {test_kinds[kind]: pairs})[test_kinds[kind]]
    return report
