"""More chat look-alikes of the kinds the first families had too few of: role, negation, scope,
number and antonym (at least ~150 of each kind in the tune and in the test split, the least that
can show a 95% upper bound under 2% when none is served).

Same shape as chat_adversaries.py's families: one filled question is a source, with rewordings
that change many words and look-alikes that change one thing that changes the answer.
The file is long for its hand tables, not its logic.
"""
from __future__ import annotations

import itertools
import random

from ops.training.pair_model.adversary_pair import AdversaryPair, mirrored, others, pairs_of

PEOPLE = ["my boss", "my coworker", "my friend", "my neighbor", "my landlord", "my roommate", "my sister",
          "my brother", "my partner", "my teacher", "my doctor", "my mother"]
# (what one person does to another, the same act worded another way)
ACTS = [("keeps ignoring", "won't stop ignoring"), ("lied to", "was not honest with"),
        ("owes money to", "has not paid back"), ("stopped talking to", "no longer speaks to"),
        ("took credit from", "claimed the work of"), ("is jealous of", "feels envious of"),
        ("yelled at", "shouted at"), ("is avoiding", "keeps staying away from")]
FEELINGS = [("likes me", "is into me", "doesn't like me"), ("trusts me", "has faith in me", "doesn't trust me"),
            ("respects me", "thinks highly of me", "doesn't respect me"),
            ("is angry with me", "is mad at me", "isn't angry with me"),
            ("wants to stay friends", "hopes we remain friends", "doesn't want to stay friends")]
CATEGORIES = ["snacks", "breakfast cereals", "breads", "sauces", "soft drinks", "desserts", "soups", "candies",
              "protein bars", "salad dressings", "frozen meals", "teas"]
CONTENTS = ["gluten", "caffeine", "lactose", "added sugar", "nuts", "soy", "eggs", "alcohol"]
ACTIVITIES = ["run", "drink coffee", "fly", "swim", "lift weights", "take ibuprofen", "eat sushi", "get a massage",
              "drive", "do yoga"]
CONDITIONS = ["pregnant", "sick with a cold", "fasting", "on antibiotics", "recovering from surgery"]
HABITS = ["drink coffee", "eat fruit", "take a shower", "stretch", "drink milk", "use my phone", "exercise",
          "eat a snack", "take melatonin", "drink tea", "read", "meditate"]
TIMES = ["before bed", "after dinner", "on an empty stomach", "right after waking up", "before a workout",
         "during work"]
JOBS = ["nurse", "software engineer", "teacher", "electrician", "accountant", "pilot", "chef", "plumber",
        "dentist", "graphic designer", "firefighter", "pharmacist"]
PRODUCTS = ["car", "phone", "video game", "album", "novel", "laptop"]
AGES = ["a toddler", "a teenager", "an adult", "an older adult", "a newborn", "a school-age child"]
# (a thing that can be made more or less of something, the adjective, its opposite)
CHANGES = [("bedroom", "warmer", "cooler"), ("bedroom", "quieter", "louder"), ("bread", "softer", "harder"),
           ("coffee", "stronger", "weaker"), ("laptop", "faster", "slower"), ("phone screen", "brighter", "dimmer"),
           ("rice", "stickier", "less sticky"), ("garden", "sunnier", "shadier"), ("hair", "thicker", "thinner"),
           ("sauce", "thicker", "thinner"), ("cookies", "chewier", "crispier"), ("room", "bigger", "smaller"),
           ("voice", "deeper", "higher"), ("car", "lighter", "heavier"), ("cake", "moister", "drier"),
           ("wifi signal", "stronger", "weaker"), ("lawn", "greener", "browner"), ("tea", "sweeter", "more bitter"),
           ("pasta", "firmer", "softer"), ("house", "cooler", "warmer")]
ILLNESSES = ["diabetes", "the flu", "Lyme disease", "dementia", "asthma", "measles", "pneumonia", "anemia",
             "a concussion", "kidney disease", "scurvy", "glaucoma", "shingles", "tetanus", "malaria"]
COUNTRY_CITY = [("France", "Paris"), ("Japan", "Tokyo"), ("Germany", "Berlin"), ("Spain", "Madrid"),
                ("Italy", "Rome"), ("Canada", "Toronto"), ("Australia", "Sydney"), ("Egypt", "Cairo"),
                ("India", "Mumbai"), ("Brazil", "Rio de Janeiro"), ("Mexico", "Mexico City"), ("Kenya", "Nairobi"),
                ("Turkey", "Istanbul"), ("Thailand", "Bangkok"), ("Argentina", "Buenos Aires"),
                ("Portugal", "Lisbon"), ("Greece", "Athens"), ("Poland", "Warsaw"), ("Vietnam", "Hanoi"),
                ("Peru", "Lima")]
TASKS = ["moving house", "a job application", "the taxes", "a wedding speech", "the garden", "a broken car",
         "a school project", "a hospital visit"]
ITEMS = ["a power bank", "a pocket knife", "peanut butter", "a laptop", "perfume", "a tripod", "frozen food",
         "a hair dryer", "a bottle of wine", "a drone", "medicine", "a camping stove", "a skateboard", "fresh fruit",
         "an umbrella", "a guitar", "a baby stroller", "sunscreen", "a selfie stick", "cash"]
PLACES = ["on a plane", "into the United States", "into a concert", "into a hospital"]
MONTHS = ["January", "March", "April", "June", "July", "August", "October", "December"]


GRIEVANCE = "What should I do if {a} {act} {b}?"  # the grievances' frame; _people_roles puts three more


def _grievances(rng: random.Random) -> list[AdversaryPair]:
    """Role: who did what to whom."""
    out = []
    for a, b in itertools.permutations(PEOPLE, 2):
        for act, worded in rng.sample(ACTS, 4):
            out += mirrored("grievance", "role", GRIEVANCE, [
                "How should I handle it when {a} {worded} {b}?",
                "{A} {act} {b}. How do I deal with this situation?"], a, b, act=act, worded=worded)
    return out


def _favors(rng: random.Random) -> list[AdversaryPair]:
    """Role: who is asked to help whom."""
    out = []
    for a, b in itertools.permutations(PEOPLE, 2):
        for task in rng.sample(TASKS, 2):
            out += mirrored("favor", "role", "How do I ask {a} to help {b} with {task}?", [
                "What is a good way to get {a} to give {b} a hand with {task}?",
                "I want {a} to assist {b} with {task}. How should I bring it up?"], a, b, task=task)
    return out


def _feelings(rng: random.Random) -> list[AdversaryPair]:
    """Negation: whether someone feels something, or does not."""
    out = []
    for person, (feels, worded, not_feels) in itertools.product(PEOPLE, FEELINGS):
        other = others(PEOPLE, person, rng, 1)[0]
        q1 = f"How can I tell if {person} {feels}?"
        out += pairs_of("feeling", q1, [
            f"What are the signs that {person} {worded}?",
            f"Is there a way to know whether {person} {feels}?"],
            [("negation", f"How can I tell if {person} {not_feels}?"),
             ("entity", f"How can I tell if {other} {feels}?")])
    return out


def _contents(rng: random.Random) -> list[AdversaryPair]:
    """Negation (with and without), scope (all against some), entity (another content)."""
    out = []
    for category, content in itertools.product(CATEGORIES, CONTENTS):
        other = others(CONTENTS, content, rng, 1)[0]
        q1 = f"Which {category} contain {content}?"
        out += pairs_of("contents", q1, [
            f"Can you name the {category} that have {content} in them?",
            f"What {category} are made with {content}?"],
            [("negation", f"Which {category} do not contain {content}?"),
             ("negation", f"Which {category} are free of {content}?"),
             ("scope", f"Do all {category} contain {content}?"),
             ("entity", f"Which {category} contain {other}?")])
    return out


def _safety(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for activity, condition in itertools.product(ACTIVITIES, CONDITIONS):
        other = others(CONDITIONS, condition, rng, 1)[0]
        q1 = f"Is it safe to {activity} while {condition}?"
        out += pairs_of("safety", q1, [
            f"While {condition}, can I {activity} without any risk?",
            f"Am I okay to {activity} when I am {condition}?"],
            [("negation", f"Why is it not safe to {activity} while {condition}?"),
             ("antonym", f"Is it dangerous to {activity} while {condition}?"),
             ("entity", f"Is it safe to {activity} while {other}?")])
    return out


def _timing(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for habit, time in itertools.product(HABITS, TIMES):
        other = others(TIMES, time, rng, 1)[0]
        q1 = f"Is it good to {habit} {time}?"
        out += pairs_of("timing", q1, [
            f"Does it help to {habit} {time}?",
            f"Should I {habit} {time}, or is that a bad idea?"],
            [("negation", f"Is it good not to {habit} {time}?"),
             ("negation", f"Why shouldn't I {habit} {time}?"),
             ("antonym", f"Is it bad to {habit} {time}?"),
             ("entity", f"Is it good to {habit} {other}?")])
    return out


def _allowed(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for item, place in itertools.product(ITEMS, PLACES):
        other = others(PLACES, place, rng, 1)[0]
        q1 = f"Am I allowed to bring {item} {place}?"
        out += pairs_of("allowed", q1, [
            f"Is it permitted to take {item} with me {place}?",
            f"Can I carry {item} {place}, or is that against the rules?"],
            [("negation", f"Why am I not allowed to bring {item} {place}?"),
             ("entity", f"Am I allowed to bring {item} {other}?")])
    return out


def _fares(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (_, a), (_, b) in rng.sample(list(itertools.permutations(COUNTRY_CITY, 2)), 160):
        q1 = f"What is the cheapest way to get from {a} to {b}?"
        out += pairs_of("fare", q1, [
            f"How can I travel from {a} to {b} while spending as little as possible?",
            f"On a tight budget, what's the least expensive route from {a} to {b}?"],
            [("antonym", f"What is the most expensive way to get from {a} to {b}?"),
             ("direction", f"What is the cheapest way to get from {b} to {a}?")])
    return out


def _rent(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for (country, city), rooms in itertools.product(COUNTRY_CITY, (1, 2, 3, 4)):
        more = rng.choice([r for r in (1, 2, 3, 4, 5) if r != rooms])
        q1 = f"What is the average monthly rent for a {rooms}-bedroom apartment in {city}?"
        out += pairs_of("rent", q1, [
            f"How much does a {rooms}-bedroom flat in {city} usually cost to rent each month?",
            f"In {city}, what do people typically pay per month for a {rooms}-bedroom apartment?"],
            [("scope", f"What is the average yearly rent for a {rooms}-bedroom apartment in {city}?"),
             ("scope", f"What is the average monthly rent for a {rooms}-bedroom apartment in {country}?"),
             ("number", f"What is the average monthly rent for a {more}-bedroom apartment in {city}?")])
    return out


def _salaries(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for job, (country, _) in itertools.product(JOBS, COUNTRY_CITY[:10]):
        other = others(JOBS, job, rng, 1)[0]
        q1 = f"What is the average yearly salary of a {job} in {country}?"
        out += pairs_of("salary", q1, [
            f"How much does a {job} in {country} earn in a year on average?",
            f"In {country}, what is a typical annual income for a {job}?"],
            [("scope", f"What is the average hourly wage of a {job} in {country}?"),
             ("scope", f"What is the average yearly salary of a {job} worldwide?"),
             ("entity", f"What is the average yearly salary of a {other} in {country}?")])
    return out


def _best_sellers(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for product, year in itertools.product(PRODUCTS, range(2008, 2024)):
        other = rng.choice([y for y in range(2000, 2024) if abs(y - year) > 1])
        q1 = f"What was the best-selling {product} of {year}?"
        out += pairs_of("best_seller", q1, [
            f"Which {product} sold the most copies in {year}?" if product in ("video game", "album", "novel")
            else f"Which {product} sold the most units in {year}?",
            f"In {year}, what {product} topped the sales charts?"],
            [("scope", f"What was the best-selling {product} of all time?"),
             ("number", f"What was the best-selling {product} of {other}?"),
             ("antonym", f"What was the worst-selling {product} of {year}?")])
    return out


def _sleep(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for age, span in itertools.product(AGES, ("each night", "in a day")):
        other = others(AGES, age, rng, 1)[0]
        q1 = f"How many hours of sleep does {age} need {span}?"
        out += pairs_of("sleep", q1, [
            f"What amount of sleep is recommended for {age} {span}?",
            f"How long should {age} sleep {span}?"],
            [("scope", f"How many hours of sleep does {age} need in a week?"),
             ("entity", f"How many hours of sleep does {other} need {span}?")])
    return out


def _percentages(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for share, whole in itertools.product((5, 10, 15, 20, 25, 30, 40, 75), (40, 60, 80, 120, 240, 360, 500, 900)):
        other_share = rng.choice([s for s in (12, 35, 45, 60, 90) if s != share])
        other_whole = rng.choice([w for w in (50, 150, 300, 640, 1000) if w != whole])
        q1 = f"What is {share} percent of {whole}?"
        out += pairs_of("percent", q1, [
            f"Calculate {share}% of {whole} for me.",
            f"If I take {share} percent out of {whole}, how much is that?"],
            [("number", f"What is {other_share} percent of {whole}?"),
             ("number", f"What is {share} percent of {other_whole}?")])
    return out


def _ages(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for year in range(1950, 2016):
        other = rng.choice([y for y in range(1950, 2016) if abs(y - year) > 2])
        q1 = f"How old is someone who was born in {year}?"
        out += pairs_of("born", q1, [
            f"If a person's birth year is {year}, what age are they now?",
            f"Born in {year}: how many years old does that make them today?"],
            [("number", f"How old is someone who was born in {other}?")])
    return out


def _changes(rng: random.Random) -> list[AdversaryPair]:
    """Antonym: the opposite change asked."""
    out = []
    for (thing, more, less), season in itertools.product(CHANGES, ("", " without spending much", " by tonight")):
        q1 = f"How can I make my {thing} {more}{season}?"
        out += pairs_of("change", q1, [
            f"What are ways to get my {thing} {more}{season}?",
            f"Any tips so that my {thing} becomes {more}{season}?"],
            [("antonym", f"How can I make my {thing} {less}{season}?"),
             ("negation", f"Why won't my {thing} get {more}{season}?")])
    return out


def _visits(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for country, city in COUNTRY_CITY:
        other = others([c for c, _ in COUNTRY_CITY], country, rng, 1)[0]
        for place in (country, city):
            q1 = f"What is the best time of year to visit {place}?"
            out += pairs_of("visit", q1, [
                f"When during the year should I travel to {place} for the nicest trip?",
                f"Which season is ideal for a trip to {place}?"],
                [("antonym", f"What is the worst time of year to visit {place}?"),
                 ("scope", f"What is the best time of day to visit {place}?"),
                 ("entity", f"What is the best time of year to visit {other}?")])
    return out


def _signs(rng: random.Random) -> list[AdversaryPair]:
    out = []
    for illness in ILLNESSES:
        other = others(ILLNESSES, illness, rng, 1)[0]
        for who in ("", " in children", " in older adults"):
            q1 = f"What are the early signs of {illness}{who}?"
            out += pairs_of("signs", q1, [
                f"How does {illness} first show up{who}?",
                f"Which first symptoms point to {illness}{who}?"],
                [("antonym", f"What are the late signs of {illness}{who}?"),
                 ("entity", f"What are the early signs of {other}{who}?")])
    return out


# (one side, the other side, what one may do to the other): rights and duties that run one way
RIGHTS = [("a landlord", "a tenant", "sue"), ("an employer", "an employee", "fire"), ("a parent", "a child", "ground"),
          ("a teacher", "a student", "fail"), ("a seller", "a buyer", "refund"), ("a doctor", "a patient", "refuse"),
          ("a referee", "a coach", "eject"), ("a bank", "a customer", "charge"), ("a club", "a member", "ban"),
          ("a company", "a contractor", "fine"), ("a host", "a guest", "evict"), ("a manager", "an intern", "reassign")]
# (one side, the other, an act either could do to the other, the same act worded another way)
DEEDS = [("a cat", "a dog", "chase", "run after"), ("a hawk", "a snake", "eat", "feed on"),
         ("a lion", "a crocodile", "attack", "go after"), ("a shark", "a dolphin", "hunt", "prey on"),
         ("an owl", "a mouse", "catch", "grab"), ("a fox", "a rabbit", "outrun", "run faster than"),
         ("a wolf", "a bear", "fight", "take on"), ("a spider", "a wasp", "kill", "be deadly to"),
         ("a chess engine", "a grandmaster", "beat", "win against"), ("a startup", "a big bank", "buy", "acquire")]
# Questions asked as "How do I ...": their rewordings change only the helper or the frame
# ("How can I", "How should I", "What is the best way to"), which the pair model once read as new questions.
HOW_TO = ["reset my router", "unclog a kitchen drain", "back up my phone", "get rid of fruit flies",
          "fix a leaky faucet", "clean a cast iron pan", "improve my credit score", "stop procrastinating",
          "fall asleep faster", "make sourdough bread", "write a cover letter", "change a flat tire",
          "lower my electricity bill", "speed up my laptop", "remove a wine stain", "train my dog to sit",
          "memorize a speech", "negotiate a higher salary", "remove a stripped screw", "keep basil alive indoors",
          "get over jet lag", "clean my laptop keyboard", "prepare for a job interview", "start running",
          "save money on groceries", "freeze fresh bread", "descale a kettle", "learn to touch type",
          "make my apartment quieter", "deal with a difficult coworker", "stop snoring",
          "cook rice without a rice cooker",
          "find a good dentist", "sharpen a kitchen knife", "set up a budget", "remove rust from tools",
          "keep my plants alive while on vacation", "calm down before an exam", "fix a squeaky door",
          "make friends in a new city"]


def _rights(rng: random.Random) -> list[AdversaryPair]:
    """Role: who may do something to whom."""
    frames = [("Can {a} {act} {b}?", ["Is {a} allowed to {act} {b}?", "Is it legal for {a} to {act} {b}?"]),
              ("When is it fair for {a} to {act} {b}?", ["In what situations may {a} {act} {b}?",
                                                         "Under which circumstances can {a} {act} {b}?"])]
    out = []
    for (a, b, act), (question, rewordings) in itertools.product(RIGHTS, frames):
        out += mirrored("rights", "role", question, rewordings, a, b, act=act)
    return out


def _deeds(rng: random.Random) -> list[AdversaryPair]:
    """Role: who does it to whom, for acts both sides could do."""
    frames = [("Why would {a} {act} {b}?", ["What makes {a} {worded} {b}?", "For what reason does {a} {act} {b}?"]),
              ("Can {a} {act} {b}?", ["Is {a} able to {worded} {b}?", "Is it possible for {a} to {act} {b}?"])]
    out = []
    for a, b, act, worded in DEEDS:
        for (first, second), (question, rewordings) in itertools.product(((a, b), (b, a)), frames):
            out += mirrored("deed", "role", question, rewordings, first, second, act=act, worded=worded)
    return out


# The other frames over the grievances' people and acts: (question, its rewordings).
PEOPLE_FRAMES = [("Is it normal that {a} {act} {b}?", ["Should I worry that {a} {worded} {b}?",
                                                        "{A} {act} {b}: is that normal?"]),
                 ("What does it mean when {a} {act} {b}?", ["Why might it be that {a} {worded} {b}?",
                                                             "{A} {act} {b}. What could that say?"]),
                 ("Who is at fault when {a} {act} {b}?", ["Whose fault is it that {a} {worded} {b}?",
                                                           "{A} {act} {b}: who is to blame?"])]


def _people_roles(rng: random.Random) -> list[AdversaryPair]:
    """Role: the same people and acts as the grievances, asked about in other frames."""
    out = []
    for (a, b), (i, (question, rewordings)) in itertools.product(itertools.permutations(PEOPLE, 2),
                                                                  enumerate(PEOPLE_FRAMES)):
        act, worded = ACTS[(PEOPLE.index(a) * 5 + PEOPLE.index(b) * 3 + i) % len(ACTS)]
        out += mirrored("people_role", "role", question, rewordings, a, b, act=act, worded=worded)
    return out


def _how_to(rng: random.Random) -> list[AdversaryPair]:
    """Rewordings that change only the helper verb or the frame, with a negation as the look-alike."""
    out = []
    for task in HOW_TO:
        for q1, rewordings in ((f"How do I {task}?", [f"How can I {task}?", f"How should I {task}?",
                                                      f"What is the best way to {task}?"]),
                               (f"How can I {task}?", [f"How do I {task}?", f"What's the way to {task}?",
                                                       f"How would I {task}?"])):
            out += pairs_of("how_to", q1, rewordings, [("negation", f"Why can't I {task}?")])
    return out


FAMILIES = (_grievances, _favors, _feelings, _allowed, _fares, _contents, _safety, _timing, _rent, _salaries,
            _best_sellers, _sleep, _percentages, _ages, _changes, _visits, _signs)
# After the statements (chat_adversaries.FAMILIES): families added later come last, so the random
# draws of the earlier ones, and so their rows, stay as they were.
LATER_FAMILIES = (_rights, _deeds, _people_roles, _how_to)
