# Over 400 lines: each kind of generated look-alike with its word lists, short rules read side by side.
"""Generated training pairs that show the verifier what changes a question's meaning.

Labelled duplicate data (QQP) rarely shows a question next to its mirror image, so a pair model
trained on it alone cannot tell "flights from Paris to London" from "flights from London to
Paris" (FACTS: a short run stayed at chance on look-alikes). From each training question we
derive:

- look-alike negatives: the two ends of "from X to Y" (or "X to Y", "X than Y") swapped, a
  number changed, a negation inserted or dropped, a word replaced by its antonym, an entity
  replaced by another of its kind from a hand table (Paris -> Rome, Monday -> Friday), two
  content words swapped;
- meaning-keeping rewordings: a synonym from a hand table, "X's Y" <-> "the Y of X", a question
  turned into "Tell me ...", a trailing clause moved to the front, digits <-> words, an acronym
  <-> its expansion, lower case without punctuation, a polite or chatty prefix, contractions made
  or undone, a typo, the two sides of "X or Y" / "X and Y" swapped.

`generate` makes them in matched pairs: each question gives one look-alike and one rewording,
so the model sees the same source change meaning under one edit and keep it under another, and
learns that the edit, not rewording in general, is what matters. (An earlier version also
replaced a random content word with any other word; the model learned from it that any new
word means a different question, and read every rewording as a look-alike. Entities now change
only within their kind.)

Everything is drawn from a seeded generator, so `brigade cache train-verifier` reproduces it.

The file is long for its hand tables (opposites, entities by kind, synonyms), not its logic: each
table is read by one generator below, and splitting them from it would only scatter one concept.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from cache.vetoes import OPPOSITE_OF, STOPWORDS

_STOP = STOPWORDS
_AUX = re.compile(r"\b(is|are|can|does|do|should|will|was|were|could|would|did|has|have)\b", re.I)
_NEGATED = re.compile(r"n't\b|\b(not|never|cannot)\b", re.I)
_FROM_TO = re.compile(r"\bfrom ((?:[\w$%.-]+ ){0,2}[\w$%.-]+) to ((?:[\w$%.-]+ ){0,2}[\w$%.-]+)", re.I)
_X_TO_Y = re.compile(r"\b([\w$%.-]+) (to|into|than|vs\.?|versus|over) ([\w$%.-]+)", re.I)
_X_OR_Y = re.compile(r"\b([A-Za-z]+) (or|and) ([A-Za-z]+)\b")
_NUMBER = re.compile(r"\b\d+(?:[.,]\d+)?\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")
_CONTRACTIONS = [
    ("do not", "don't"), ("does not", "doesn't"), ("is not", "isn't"), ("are not", "aren't"), ("can not", "can't"),
    ("cannot", "can't"), ("what is", "what's"), ("I am", "I'm"), ("it is", "it's"), ("should not", "shouldn't"),
    ("will not", "won't"), ("did not", "didn't"), ("how is", "how's"), ("who is", "who's"), ("where is", "where's"),
]
_PREFIXES = ["Can you tell me ", "Please tell me ", "I want to know ", "Quick question: ", "Hey, ",
             "I'd like to know ", "Could you explain ", "Tell me "]
# Words whose swap across "to"/"than" keeps meaning are rare; words that start a verb phrase
# ("how to learn") make nonsense, which is a wasted example rather than a wrong one.
_NOT_ENDPOINTS = {"how", "what", "want", "need", "have", "going", "able", "way", "ways", "due", "up", "used",
                  "is", "are", "it", "be", "go", "get", "back", "according", "compared", "next", "close", "more",
                  "less", "rather", "better", "worse", "i", "you", "me", "we", "them"}


@dataclass(frozen=True)
class GeneratedPair:
    q1: str
    q2: str
    duplicate: bool
    kind: str


def _swap_from_to(q: str, rng: random.Random) -> str | None:
    m = _FROM_TO.search(q)
    if m and m.group(1).lower() != m.group(2).lower():
        return q[:m.start()] + f"from {m.group(2)} to {m.group(1)}" + q[m.end():]
    for m in _X_TO_Y.finditer(q):
        a, link, b = m.group(1), m.group(2), m.group(3)
        if a.lower() in _NOT_ENDPOINTS or b.lower() in _NOT_ENDPOINTS or a.lower() == b.lower():
            continue
        if a.lower() in _STOP or b.lower() in _STOP:
            continue
        if link.lower().startswith("v"):  # "X vs Y" reads the same both ways
            continue
        return q[:m.start()] + f"{b} {link} {a}" + q[m.end():]
    return None


def _change_number(q: str, rng: random.Random) -> str | None:
    numbers = list(_NUMBER.finditer(q))
    if not numbers:
        return None
    m = rng.choice(numbers)
    text = m.group(0).replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    new = value * rng.choice([2, 10, 0.5]) if value > 3 else value + rng.choice([1, 2, 5])
    new_text = str(int(new)) if float(new).is_integer() else f"{new:g}"
    if new_text == text:
        return None
    return q[:m.start()] + new_text + q[m.end():]


def _flip_negation(q: str, rng: random.Random) -> str | None:
    m = _NEGATED.search(q)
    if m:
        word = m.group(0).lower()
        if word == "n't":
            head = q[:m.start()]
            head = head[:-2] + "can" if head.lower().endswith("ca") else head[:-2] + "will" if head.lower().endswith(
                "wo") else head
            return head + q[m.end():]
        if word == "cannot":
            return q[:m.start()] + "can" + q[m.end():]
        return (q[:m.start()] + q[m.end():]).replace("  ", " ")
    m = _AUX.search(q)
    if not m:
        return None
    return q[:m.end()] + " not" + q[m.end():]


# Opposites that are as often particles ("work on AC", "set up", "over there"): the swap makes nonsense.
_PARTICLES = {"on", "off", "up", "down", "over", "under"}


def _antonym(q: str, rng: random.Random) -> str | None:
    words = [m for m in _WORD.finditer(q) if m.group(0).lower() in OPPOSITE_OF and m.group(0).lower() not in _PARTICLES]
    if not words:
        return None
    m = rng.choice(words)
    new = rng.choice(sorted(OPPOSITE_OF[m.group(0).lower()]))
    if m.group(0)[0].isupper():
        new = new.capitalize()
    return q[:m.start()] + new + q[m.end():]


def _swap_words(q: str, rng: random.Random) -> str | None:
    """Two content words trade places: "impact of media on culture" -> "impact of culture on media"."""
    content = [m for m in _WORD.finditer(q) if m.group(0).lower() not in _STOP and len(m.group(0)) > 2]
    if len(content) < 2:
        return None
    a, b = sorted(rng.sample(content, 2), key=lambda m: m.start())
    if a.group(0).lower() == b.group(0).lower():
        return None
    return q[:a.start()] + b.group(0) + q[a.end():b.start()] + a.group(0) + q[b.end():]


# Entities of one kind: one for another asks about something else. Kept to words that are rarely
# anything but the entity, so the swap is a different question, never a rewording.
_SIBLINGS = [
    ["Paris", "London", "Rome", "Berlin", "Madrid", "Tokyo", "Sydney", "Chicago", "Toronto", "Dubai"],
    ["France", "Germany", "Italy", "Spain", "Japan", "Canada", "Brazil", "India", "Mexico", "Australia"],
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    ["January", "February", "March", "April", "June", "July", "August", "September", "October",
     "November", "December"],
    ["Python", "Java", "JavaScript", "Rust", "C++", "Ruby", "Go", "PHP"],
    ["Windows", "Linux", "macOS", "Android", "iOS"],
    ["dog", "cat", "rabbit", "hamster", "parrot"], ["dogs", "cats", "rabbits", "horses"],
    ["chicken", "beef", "pork", "salmon", "tofu", "lamb"], ["rice", "pasta", "potatoes", "quinoa"],
    ["coffee", "tea", "milk", "wine", "beer"], ["breakfast", "lunch", "dinner"],
    ["apple", "banana", "orange", "mango"], ["apples", "bananas", "oranges", "strawberries"],
    ["spring", "summer", "autumn", "winter"], ["morning", "afternoon", "evening", "night"],
    ["iPhone", "Samsung", "Pixel"], ["Mars", "Venus", "Jupiter", "Saturn", "Mercury", "Neptune"],
    ["heart", "liver", "kidney", "lungs", "brain"], ["diabetes", "asthma", "arthritis", "migraine"],
    ["guitar", "piano", "violin", "drums"], ["football", "basketball", "tennis", "cricket", "baseball"],
    ["euro", "dollar", "pound", "yen"], ["euros", "dollars", "pounds", "yen"],
    ["kilometers", "miles", "meters", "feet"], ["grams", "ounces", "pounds", "kilograms"],
    ["Celsius", "Fahrenheit", "Kelvin"], ["hours", "minutes", "days", "weeks"], ["year", "month", "week"],
    ["capital", "population", "currency", "area"], ["husband", "wife", "son", "daughter"],
    ["mother", "father", "sister", "brother"], ["Excel", "Word", "PowerPoint"],
    ["Chrome", "Firefox", "Safari"], ["Amazon", "Google", "Apple", "Microsoft", "Netflix"],
    ["Shakespeare", "Dickens", "Tolstoy"], ["Einstein", "Newton", "Darwin", "Tesla"],
    ["oxygen", "nitrogen", "hydrogen", "carbon"], ["iron", "calcium", "magnesium", "zinc"],
    ["vitamin D", "vitamin C", "vitamin B12"], ["protein", "fat", "sugar", "fiber"],
    ["red", "blue", "green", "yellow", "black", "white"],
]
_SIBLING_OF = {w: [o for o in group if o != w] for group in _SIBLINGS for w in group}
_SIBLING = re.compile(r"(?<![\w+])(" + "|".join(sorted((re.escape(w) for w in _SIBLING_OF), key=len, reverse=True))
                      + r")(?![\w+])")


def _sibling(q: str, rng: random.Random) -> str | None:
    """An entity for another of its kind: "capital of France" -> "capital of Spain"."""
    found = list(_SIBLING.finditer(q))
    if not found:
        return None
    m = rng.choice(found)
    return q[:m.start()] + rng.choice(_SIBLING_OF[m.group(0)]) + q[m.end():]


NEGATIVE_MAKERS = {
    "swap_ends": _swap_from_to,
    "number": _change_number,
    "negation": _flip_negation,
    "antonym": _antonym,
    "sibling": _sibling,
    "swap_words": _swap_words,
}


def _plain(q: str, rng: random.Random) -> str | None:
    out = re.sub(r"[^\w\s']", "", q).lower().strip()
    return out if out and out != q else None


def _prefixed(q: str, rng: random.Random) -> str | None:
    q = q.strip()
    if not q:
        return None
    body = q[0].lower() + q[1:] if not q[:2].isupper() else q
    return rng.choice(_PREFIXES) + body


def _contract(q: str, rng: random.Random) -> str | None:
    pairs = _CONTRACTIONS[:]
    rng.shuffle(pairs)
    for long, short in pairs:
        for a, b in ((long, short), (short, long)):
            m = re.search(r"\b" + re.escape(a) + r"\b", q, re.I)
            if m:
                repl = b[0].upper() + b[1:] if m.group(0)[0].isupper() else b
                return q[:m.start()] + repl + q[m.end():]
    return None


def _typo(q: str, rng: random.Random) -> str | None:
    words = [m for m in _WORD.finditer(q) if len(m.group(0)) >= 5]
    if not words:
        return None
    m = rng.choice(words)
    w = m.group(0)
    i = rng.randrange(1, len(w) - 2)
    new = w[:i] + w[i + 1] + w[i] + w[i + 2:] if rng.random() < 0.5 else w[:i] + w[i + 1:]
    return q[:m.start()] + new + q[m.end():]


def _swap_or(q: str, rng: random.Random) -> str | None:
    for m in _X_OR_Y.finditer(q):
        a, b = m.group(1), m.group(3)
        if a.lower() in _STOP or b.lower() in _STOP or a.lower() == b.lower():
            continue
        return q[:m.start()] + f"{b} {m.group(2)} {a}" + q[m.end():]
    return None


# Words and phrases that mean the same in a question, either way round.
_SYNONYMS = [
    ("buy", "purchase"), ("big", "large"), ("quick", "fast"), ("quickly", "fast"), ("begin", "start"),
    ("car", "automobile"), ("help", "assist"), ("choose", "pick"), ("cheap", "inexpensive"), ("movie", "film"),
    ("movies", "films"), ("doctor", "physician"), ("kids", "children"), ("child", "kid"), ("job", "occupation"),
    ("use", "utilize"), ("fix", "repair"), ("get rid of", "remove"), ("find out", "discover"),
    ("learn", "study"), ("mistake", "error"), ("mistakes", "errors"), ("shows", "indicates"), ("answer", "reply"),
    ("hard", "difficult"), ("easy", "simple"), ("enough", "sufficient"), ("need", "require"), ("needs", "requires"),
    ("about", "approximately"), ("around", "roughly"), ("so", "very"), ("house", "home"), ("town", "city"),
    ("ill", "sick"), ("medicine", "medication"), ("tired", "exhausted"), ("happy", "glad"), ("maybe", "perhaps"),
    ("smart", "clever"), ("rich", "wealthy"), ("cook", "prepare"), ("pay", "cover"), ("keep", "retain"),
    ("build", "construct"), ("show", "display"), ("look for", "search for"),
    ("set up", "configure"), ("main", "primary"), ("biggest", "largest"), ("tiny", "very small"),
    ("often", "frequently"), ("mostly", "mainly"), ("money", "cash"), ("trip", "journey"), ("price", "cost"),
    ("speed up", "accelerate"), ("explain", "describe"), ("meaning", "definition"), ("correct", "right"),
    ("unwell", "ill"), ("hurt", "injure"), ("stomach", "belly"), ("sneakers", "running shoes"),
    ("vacation", "holiday"), ("cellphone", "mobile phone"), ("laptop", "notebook computer"),
]
_SYNONYM_OF = {}
for _a, _b in _SYNONYMS:
    _SYNONYM_OF.setdefault(_a, _b)
    _SYNONYM_OF.setdefault(_b, _a)
_SYNONYM = re.compile(r"\b(" + "|".join(sorted((re.escape(w) for w in _SYNONYM_OF), key=len, reverse=True))
                      + r")\b", re.I)
_ACRONYMS = [
    ("USA", "United States"), ("UK", "United Kingdom"), ("EU", "European Union"), ("UN", "United Nations"),
    ("NYC", "New York City"), ("AI", "artificial intelligence"), ("ML", "machine learning"),
    ("CPU", "central processing unit"), ("GPU", "graphics card"), ("RAM", "memory"), ("OS", "operating system"),
    ("PC", "personal computer"), ("TV", "television"), ("ID", "identity card"), ("BMI", "body mass index"),
    ("GDP", "gross domestic product"), ("VPN", "virtual private network"), ("API", "application programming interface"),
    ("DIY", "do it yourself"), ("ETF", "exchange-traded fund"), ("ISP", "internet service provider"),
    ("CEO", "chief executive officer"), ("DNA", "genetic code"), ("km", "kilometers"), ("kg", "kilograms"),
    ("mph", "miles per hour"), ("WWII", "World War II"), ("WW2", "the Second World War"), ("HR", "human resources"),
    ("IT", "information technology"), ("ASAP", "as soon as possible"), ("FAQ", "frequently asked questions"),
    ("NASA", "the US space agency"), ("ATM", "cash machine"), ("PDF", "PDF file"), ("CV", "resume"),
]
_ACRONYM_OF = {}
for _a, _b in _ACRONYMS:
    _ACRONYM_OF.setdefault(_a, _b)
    _ACRONYM_OF.setdefault(_b.lower(), _a)
_ACRONYM = re.compile(r"\b(" + "|".join(sorted((re.escape(a) for a, _ in _ACRONYMS), key=len, reverse=True))
                      + r")\b|\b(" + "|".join(sorted((re.escape(b) for _, b in _ACRONYMS), key=len, reverse=True))
                      + r")\b", re.I)
_DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_DIGIT_WORDS) + r"|\d{1,2})\b", re.I)
_POSSESSIVE = re.compile(r"\b((?:[A-Z][\w-]*\s){0,2}[A-Z][\w-]*)'s ((?:[a-z]+ )?[a-z]+)\b")
_THE_OF = re.compile(r"\bthe ([a-z]+(?: [a-z]+)?) of ((?:[A-Z][\w-]*\s){0,2}[A-Z][\w-]*)\b")
_TELL_ME = [
    (re.compile(r"^what (is|are|was|were) (.+?)\?*$", re.I), lambda m: f"Tell me what {m[2]} {m[1].lower()}."),
    (re.compile(r"^how (?:do|can|should) i (.+?)\?*$", re.I), lambda m: f"Tell me how to {m[1]}."),
    (re.compile(r"^(who|when|where|why|how) (is|are|was|were|did|does|do) (.+?)\?*$", re.I),
     lambda m: f"Tell me {m[1].lower()} {m[2].lower()} {m[3]}."),
    (re.compile(r"^(?:can|could) you (?:tell me|explain) (.+?)[?.]*$", re.I), lambda m: f"Tell me {m[1]}."),
    (re.compile(r"^tell me (about .+?)[.!]*$", re.I), lambda m: f"What can you tell me {m[1]}?"),
]
_TRAILING_CLAUSE = re.compile(r"^(.+?),? ((?:in|on|during|for|at|after|before|when|if|while|without) [^,?]{3,40})\?$")
_LEADING_CLAUSE = re.compile(r"^((?:In|On|During|For|At|After|Before|When|If|While|Without) [^,?]{3,40}), (.+?)\?$")


def _cased(new: str, old: str) -> str:
    return new[0].upper() + new[1:] if old[:1].isupper() and new[:1].islower() else new


def _synonym(q: str, rng: random.Random) -> str | None:
    found = list(_SYNONYM.finditer(q))
    if not found:
        return None
    m = rng.choice(found)
    return q[:m.start()] + _cased(_SYNONYM_OF[m.group(0).lower()], m.group(0)) + q[m.end():]


def _possessive_of(q: str, rng: random.Random) -> str | None:
    """"France's capital" <-> "the capital of France"."""
    m = _POSSESSIVE.search(q)
    if m:
        return q[:m.start()] + f"the {m[2]} of {m[1]}" + q[m.end():]
    m = _THE_OF.search(q)
    if m:
        return q[:m.start()] + f"{m[2]}'s {m[1]}" + q[m.end():]
    return None


def _tell_me(q: str, rng: random.Random) -> str | None:
    """"What is X?" -> "Tell me what X is."; "Tell me about X" -> "What can you tell me about X?"."""
    for pattern, build in _TELL_ME:
        m = pattern.match(q.strip())
        if m:
            return build(m)
    return None


def _clause_to_front(q: str, rng: random.Random) -> str | None:
    """"What should I eat before a run?" <-> "Before a run, what should I eat?"."""
    q = q.strip()
    m = _LEADING_CLAUSE.match(q)
    if m:
        body = m[2]
        return body[0].upper() + body[1:] + " " + m[1][0].lower() + m[1][1:] + "?"
    m = _TRAILING_CLAUSE.match(q)
    if not m or len(m[1].split()) < 3:
        return None
    body = m[1] if m[1][:2].isupper() else m[1][0].lower() + m[1][1:]
    return m[2][0].upper() + m[2][1:] + ", " + body + "?"


def _digits_words(q: str, rng: random.Random) -> str | None:
    """"3 eggs" <-> "three eggs" (up to twenty)."""
    for m in _NUMBER_WORD.finditer(q):
        word = m.group(0)
        if word.isdigit():
            if int(word) > 20:
                continue
            new = _DIGIT_WORDS[int(word)]
        else:
            if word.lower() == "one":  # "one" is as often a pronoun as a number
                continue
            new = str(_DIGIT_WORDS.index(word.lower()))
        return q[:m.start()] + _cased(new, word) + q[m.end():]
    return None


def _acronym(q: str, rng: random.Random) -> str | None:
    """"USA" <-> "United States", "AI" <-> "artificial intelligence"."""
    for m in _ACRONYM.finditer(q):
        if m.group(1):
            if m.group(1) not in _ACRONYM_OF:  # case matters for acronyms ("it" is not IT)
                continue
            return q[:m.start()] + _ACRONYM_OF[m.group(1)] + q[m.end():]
        return q[:m.start()] + _ACRONYM_OF[m.group(2).lower()] + q[m.end():]
    return None


POSITIVE_MAKERS = {
    "synonym": _synonym,
    "possessive": _possessive_of,
    "tell_me": _tell_me,
    "clause_front": _clause_to_front,
    "digits": _digits_words,
    "acronym": _acronym,
    "plain": _plain,
    "prefix": _prefixed,
    "contraction": _contract,
    "typo": _typo,
    "swap_or": _swap_or,
}
# Edits a chat user's look-alike makes most (another place, number, direction, opposite); negation
# inserted by rule and word salad are cheap and easy, so they come less often.
_NEGATIVE_WEIGHT = {"swap_ends": 3, "number": 3, "antonym": 3, "sibling": 3, "negation": 1, "swap_words": 1}
# Rewordings a chat user writes are mostly of the first six kinds; the rest are cheap noise.
_POSITIVE_WEIGHT = {"synonym": 3, "possessive": 2, "tell_me": 2, "clause_front": 2, "digits": 1, "acronym": 1,
                    "plain": 1, "prefix": 1, "contraction": 1, "typo": 1, "swap_or": 1}


def _one_of(makers: dict, q: str, rng: random.Random, weights: dict | None = None) -> tuple[str, str] | None:
    """The first maker, in a random (weighted) order, that changes `q`."""
    kinds = sorted(makers)
    w = [(weights or {}).get(k, 1) for k in kinds]
    order = []
    while kinds:
        k = rng.choices(kinds, w)[0]
        i = kinds.index(k)
        order.append(kinds.pop(i))
        w.pop(i)
    for kind in order:
        new = makers[kind](q, rng)
        if new and new.strip() and new.strip() != q.strip():
            return kind, new
    return None


def generate(questions: list[str], pairs: int, seed: int = 0) -> list[GeneratedPair]:
    """Up to `pairs` matched pairs: from each question one look-alike (duplicate=False) and one
    rewording (duplicate=True), or nothing when either cannot be made."""
    rng = random.Random(seed)
    order = questions[:]
    rng.shuffle(order)
    out: list[GeneratedPair] = []
    for q in order:
        if len(out) >= 2 * pairs:
            break
        negative = _one_of(NEGATIVE_MAKERS, q, rng, _NEGATIVE_WEIGHT)
        positive = _one_of(POSITIVE_MAKERS, q, rng, _POSITIVE_WEIGHT)
        if negative and positive:
            out.append(GeneratedPair(q, negative[1], False, negative[0]))
            out.append(GeneratedPair(q, positive[1], True, positive[0]))
    return out
