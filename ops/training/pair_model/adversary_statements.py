"""Long chat statements (15 words and more), reworded and changed: what people type when they
explain their situation before asking, the text a pair model reading short questions scores down.

Each source is one long message; its rewordings say the same situation in other words and
another order, and its look-alikes change one detail that changes the answer (the two ends of a
trip, a number, who did what, "not"). The file is long for its hand tables, not its logic.
"""
from __future__ import annotations

import itertools
import random

from ops.training.pair_model.adversary_pair import AdversaryPair, others, pairs_of

CITIES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Dublin", "Tokyo",
          "Boston", "Chicago", "Seattle", "Toronto", "Sydney", "Cairo"]
MONTHS = ["January", "March", "May", "July", "September", "November"]
COMPANY = ["my two young kids", "my elderly parents", "my partner", "a group of college friends", "my dog"]
DEVICES = ["laptop", "phone", "tablet", "smart TV", "printer", "router", "gaming console", "smartwatch"]
PROBLEMS = [("shutting down on its own", "shuts itself off"), ("running very slowly", "has become really slow"),
            ("losing its wifi connection", "keeps dropping the wifi"),
            ("draining the battery fast", "goes through its battery quickly"),
            ("freezing every few minutes", "locks up every couple of minutes")]
CHANGES = ["installed the latest update", "dropped it on the floor", "moved to a new apartment",
           "changed my password", "added a new app"]
HABITS = [("drinking a green smoothie", "having a green smoothie"), ("running five kilometers", "going for a 5 km run"),
          ("meditating for twenty minutes", "doing twenty minutes of meditation"),
          ("taking a cold shower", "showering in cold water"), ("eating a big breakfast", "having a large breakfast")]
SYMPTOMS = ["tired", "dizzy", "hungry", "anxious", "sleepy"]
# (who asks, who is asked): "My manager asked me to ..." against "I asked my manager to ..."
TASKS = ["work on Saturday", "cover a colleague's shift", "stay late every evening", "answer emails on vacation",
         "train the new hires"]
DAYS = [3, 4, 5]


def _trips(rng: random.Random) -> list[AdversaryPair]:
    out = []
    pairs = list(itertools.permutations(CITIES, 2))
    for a, b in rng.sample(pairs, 160):
        days = rng.choice((3, 5, 7, 10, 14))
        month, company = rng.choice(MONTHS), rng.choice(COMPANY)
        longer = rng.choice([d for d in (4, 6, 12, 21) if d != days])
        other_month = others(MONTHS, month, rng, 1)[0]
        q1 = (f"I am planning a {days}-day trip from {a} to {b} in {month} with {company}, "
              f"and I would like to know what I should pack for it.")
        out += pairs_of("trip", q1, [
            f"In {month} I'm going from {a} to {b} for {days} days, together with {company}. "
            f"What do we need to bring along?",
            f"What should go in my suitcase? {company.capitalize()} and I will travel from {a} to {b} "
            f"for {days} days this {month}."],
            [("direction", f"I am planning a {days}-day trip from {b} to {a} in {month} with {company}, "
                           f"and I would like to know what I should pack for it."),
             ("number", f"I am planning a {longer}-day trip from {a} to {b} in {month} with {company}, "
                        f"and I would like to know what I should pack for it."),
             ("entity", f"I am planning a {days}-day trip from {a} to {b} in {other_month} with {company}, "
                        f"and I would like to know what I should pack for it.")])
    return out


def _devices(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for device, (problem, worded), change in itertools.product(DEVICES, PROBLEMS, CHANGES):
        if rng.random() > 0.6:
            continue
        other_device = others(DEVICES, device, rng, 1)[0]
        other_problem = rng.choice([p for p, _ in PROBLEMS if p != problem])
        q1 = (f"My {device} has been {problem} ever since I {change}, and restarting it has not helped at all, "
              f"so what should I do?")
        out += pairs_of("device", q1, [
            f"Since I {change}, my {device} {worded}. I already tried turning it off and on again. "
            f"How can I fix this?",
            f"Restarting did nothing: after I {change} my {device} {worded}. Any idea what to try next?"],
            [("entity", f"My {other_device} has been {problem} ever since I {change}, and restarting it has not "
                        f"helped at all, so what should I do?"),
             ("entity", f"My {device} has been {other_problem} ever since I {change}, and restarting it has not "
                        f"helped at all, so what should I do?")])
    return out


def _routines(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (habit, worded), symptom, weeks in itertools.product(HABITS, SYMPTOMS, (2, 3, 6)):
        other = others(SYMPTOMS, symptom, rng, 1)[0]
        q1 = (f"I have been {habit} every morning for the past {weeks} weeks, but I still feel {symptom} "
              f"in the afternoon; what could be causing it?")
        out += pairs_of("routine", q1, [
            f"For {weeks} weeks now I start each day {worded}, yet by the afternoon I'm still {symptom}. "
            f"What might be the reason?",
            f"Why would I feel {symptom} every afternoon even though I've been {worded} each morning "
            f"for {weeks} weeks?"],
            [("negation", f"I have not been {habit} every morning for the past {weeks} weeks, and I feel "
                          f"{symptom} in the afternoon; what could be causing it?"),
             ("entity", f"I have been {habit} every morning for the past {weeks} weeks, but I still feel {other} "
                        f"in the afternoon; what could be causing it?"),
             ("scope", f"I have been {habit} once a week for the past {weeks} weeks, but I still feel {symptom} "
                       f"in the afternoon; what could be causing it?")])
    return out


def _obligations(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for task, days in itertools.product(TASKS, DAYS):
        for boss in ("my manager", "my team lead", "the company owner"):
            more = rng.choice([d for d in (2, 6) if d != days])
            q1 = (f"{boss.capitalize()} asked me to {task} even though my contract says I only work {days} days "
                  f"a week; am I obliged to do it?")
            out += pairs_of("obligation", q1, [
                f"My contract is for {days} days a week, but {boss} wants me to {task}. "
                f"Do I have to agree to that?",
                f"Am I required to {task} when {boss} asks, given that I'm only contracted for {days} days "
                f"each week?"],
                [("role", f"I asked {boss} to {task} even though their contract says they only work {days} days "
                          f"a week; are they obliged to do it?"),
                 ("number", f"{boss.capitalize()} asked me to {task} even though my contract says I only work "
                            f"{more} days a week; am I obliged to do it?")])
    return out


FAMILIES = (_trips, _devices, _routines, _obligations)
