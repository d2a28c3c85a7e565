"""Lexical vetoes against semantic false hits (the answer cache's; the content guards that refuse a prompt or an answer are gateway/admission/content_guards.py).

Two questions can embed close yet ask different things. Each guard compares one kind of
detail that an embedding blurs, and vetoes the hit when the two questions disagree on it.
They compare meaning, not wording: details are first written one way (cache/wording.py), and a
detail that one side adds is no disagreement ("How long does one rotation take, in hours?"
rewords "How many hours does the Earth take to rotate once?"); one that each side states
differently is (1998 / 2008, Java / Python). docs/cache.md lists what each guard catches and
what it cannot, measured.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from cache.wording import (
    CLAUSE_ENDS,
    STOPWORDS,
    dates_of,
    is_word,
    mentioned,
    mentions_of,
    names_of,
    numbers_of,
    plain,
    tokens_of,
    with_names,
)

_NEGATIONS = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "cannot", "cant", "dont",
              "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont", "couldnt", "shouldnt", "wouldnt"}
# Pairs of words whose swap reverses a question's meaning while barely moving its embedding.
_OPPOSITES = [
    ("enable", "disable"), ("enabled", "disabled"), ("on", "off"), ("increase", "decrease"), ("add", "remove"),
    ("start", "stop"), ("before", "after"), ("buy", "sell"), ("min", "max"), ("minimum", "maximum"),
    ("best", "worst"), ("more", "less"), ("most", "least"), ("up", "down"), ("open", "close"),
    ("install", "uninstall"), ("encrypt", "decrypt"), ("import", "export"), ("upload", "download"),
    ("lock", "unlock"), ("win", "lose"), ("pros", "cons"), ("advantages", "disadvantages"), ("safe", "unsafe"),
    ("legal", "illegal"), ("possible", "impossible"), ("true", "false"), ("male", "female"), ("men", "women"),
    ("cheap", "expensive"), ("fast", "slow"), ("hot", "cold"), ("high", "low"), ("first", "last"),
    ("north", "south"), ("east", "west"), ("love", "hate"), ("positive", "negative"), ("accept", "reject"),
    ("allow", "deny"), ("allow", "block"), ("include", "exclude"), ("inside", "outside"), ("import", "export"),
    ("good", "bad"), ("better", "worse"), ("healthy", "unhealthy"), ("benefits", "risks"), ("strong", "weak"),
    ("rich", "poor"), ("old", "young"), ("older", "younger"), ("big", "small"), ("bigger", "smaller"),
    ("long", "short"), ("longer", "shorter"), ("heavy", "light"), ("early", "late"), ("above", "below"),
    ("over", "under"), ("push", "pull"), ("send", "receive"), ("borrow", "lend"),
    ("encode", "decode"), ("join", "leave"), ("connect", "disconnect"), ("show", "hide"), ("visible", "hidden"),
]
OPPOSITE_OF: dict[str, set[str]] = {}
for a, b in _OPPOSITES:
    OPPOSITE_OF.setdefault(a, set()).add(b)
    OPPOSITE_OF.setdefault(b, set()).add(a)

# Words that give the words after them a role in the question: "from" and "to" name the two ends,
# "than" the thing compared with, "of" whose. Two words that trade roles trade meaning: "from Paris
# to London" / "from London to Paris", "impact of media on culture" / "of culture on media".
# "vs", "or" and "and" give both sides one role: "Python vs Java" asks what "Java vs Python" asks.
_RELATIONS = {"from", "to", "into", "onto", "than", "of", "on", "in", "at", "by", "for", "with", "over", "under",
              "against", "toward", "towards", "through", "via", "per", "within", "across"}
# Words between two exchanged stretches that leave the question unchanged: "a fruit or a vegetable"
# is "a vegetable or a fruit", "Python vs Java" is "Java vs Python".
_SYMMETRIC = {"and", "or", "vs", "versus", "nor", "plus"}
_ARTICLES = {"a", "an", "the"}
# The order guard compares the order of shared words only where the two share most content words
# (Jaccard): there, a different order is the same words rearranged.
ORDER_MIN_OVERLAP = 0.7


@dataclass(frozen=True)
class Details:
    """The details of a question that the guards compare, each written one way."""

    numbers: tuple[str, ...]  # repeats kept: a number stated twice counts twice
    dates: frozenset[str]
    negated: bool
    words: frozenset[str]
    entities: frozenset[str]
    said: tuple[str, ...] = ()  # the words in order, "with no" read as "without"
    roles: tuple[tuple[str, str], ...] = ()  # each content word with its role (`_roles`)
    tokens: tuple[str, ...] = ()
    named: tuple[str, ...] = ()  # the tokens with names abbreviated (`with_names`)

    @cached_property
    def mentions(self) -> frozenset[str]:
        """Every key under which something it mentions can be found; asked only for a name that
        the other question does not contain as written (most are), so built only then."""
        return mentions_of(list(self.tokens), list(self.named))


def words_of(text: str) -> list[str]:
    return _words(tokens_of(text))




@lru_cache(maxsize=4096)  # a question is compared with several candidates, a candidate with many questions
def details(text: str) -> Details:
    tokens = tokens_of(text)
    named = with_names(tokens)
    negations = sum(1 for i in range(len(tokens)) if _negates(tokens, i))
    # Both spellings of a name: "New York City" written "NYC" still mentions "New York".
    words = frozenset(plain(t) for t in tokens + named if t[0].isalnum())
    return Details(numbers_of(tokens), dates_of(tokens), negations % 2 == 1, words, names_of(named),
                   tuple(_said(_words(tokens))), tuple(_roles(named)), tuple(tokens), tuple(named))


def _words(tokens: list[str]) -> list[str]:
    return [t.lower().replace("'", "") for t in tokens if t[0].isalnum()]


def _negates(tokens: list[str], i: int) -> bool:
    """The token negates what it stands in. Not the "no" of "with no" (read as "without"), the
    "or not" of a yes-or-no question ("tell if a guy likes you or not"), "not only", or a bare
    "if not" ("If not, what was the last one?")."""
    t = tokens[i]
    if not is_word(t) or not (plain(t) in _NEGATIONS or t.lower().endswith("n't")):
        return False
    before = tokens[i - 1].lower() if i > 0 else ""
    after = tokens[i + 1].lower() if i + 1 < len(tokens) else "."
    word = t.lower()
    if word == "no" and before == "with" or word in ("not", "no") and before == "or":
        return False
    return not (word == "not" and (after == "only" or before == "if" and after in CLAUSE_ENDS))


def _said(words: list[str]) -> list[str]:
    """The words, with "with no" read as "without"."""
    out: list[str] = []
    for w in words:
        if w == "no" and out and out[-1] == "with":
            out[-1] = "without"
        else:
            out.append(w)
    return out


def _roles(tokens: list[str]) -> list[tuple[str, str]]:
    """Each content word (a plural as its singular) with its role: the last relation word before
    it in its clause, or "" before any."""
    out = []
    relation = ""
    for t in tokens:
        if t in CLAUSE_ENDS:
            relation = ""
            continue
        word = plain(t)
        if word in _RELATIONS:
            relation = word
        elif word not in STOPWORDS and word not in _SYMMETRIC:
            out.append((word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word,
                        relation))
    return out


def _replaced(mine: Iterable[str], theirs: Iterable[str]) -> bool:
    """Each side states one the other does not: a detail changed, not one added."""
    mine, theirs = Counter(mine), Counter(theirs)
    return bool(mine - theirs) and bool(theirs - mine)


def _names_differ(q: Details, c: Details) -> bool:
    """Each side names something that the other does not mention in any form: "Java" / "Python",
    but not "Kenya's" / "Kenya", "Kenyan" / "Kenya" or "USA" / "United States"."""
    def unmentioned(mine: Details, theirs: Details) -> bool:
        return any(e not in theirs.words and not mentioned(e, theirs.mentions) for e in mine.entities)

    return unmentioned(q, c) and unmentioned(c, q)


def _opposed(fewer: Counter, more: Counter) -> bool:
    return any(OPPOSITE_OF.get(w, set()) & more.keys() for w in fewer)


def _with_against_without(fewer: Counter, more: Counter) -> bool:
    """"coffee with milk" / "coffee without milk"; a lone "without" is a rewording ("lose weight
    without dieting" asks what "lose weight with no diet" asks)."""
    return ("with" in fewer and "without" in more) or ("without" in fewer and "with" in more)


def _traded(q: list[str], c: list[str]) -> bool:
    """The same words, except two stretches holding content words exchanged places around a
    middle that stayed: "Is methylphenidate a methamphetamine?" / "Is methamphetamine a
    methylphenidate?", "is God white" / "is white God". A clause moves freely past the rest, and
    an adverb or an -ing form past its neighbour ("financially stable" / "stable financially", "muscle building" /
    "building muscle"), and so does a negation ("why highways don't" / "why don't highways")."""
    if len(q) != len(c) or q == c or Counter(q) != Counter(c):
        return False
    start = next(i for i, (a, b) in enumerate(zip(q, c)) if a != b)
    end = next(i for i, (a, b) in enumerate(zip(reversed(q), reversed(c))) if a != b)
    qm, cm = q[start:len(q) - end], c[start:len(c) - end]
    n = len(qm)
    for la in range(1, n):
        for lb in range(1, n - la + 1):
            if qm[:la] == cm[n - la:] and qm[n - lb:] == cm[:lb] and qm[la:n - lb] == cm[lb:n - la]:
                middle = qm[la:n - lb]
                symmetric = any(w in _SYMMETRIC for w in middle) and all(w in _SYMMETRIC | _ARTICLES for w in middle)
                content = all(any(w not in STOPWORDS and w not in _NEGATIONS for w in block)
                              for block in (qm[:la], qm[n - lb:]))
                # Neighbouring stretches that trade places are a moved clause ("In Python, how do
                # I sort a list" / "How do I sort a list in Python"), unless each is one word.
                movable = not middle and (la > 1 or lb > 1 or any(w.endswith(("ly", "ing")) for w in qm))
                return content and not symmetric and not movable
    return False


def _traded_roles(shared: list[str], q_role: dict[str, str], c_role: dict[str, str]) -> bool:
    """Two words exchanged their relation words: "from Paris to London" / "from London to Paris",
    "convert Celsius to Fahrenheit" / "convert Fahrenheit to Celsius"."""
    return any(q_role[a] != q_role[b] and q_role[a] == c_role[b] and q_role[b] == c_role[a]
               for i, a in enumerate(shared) for b in shared[i + 1:])


def _crossed(order: list[int]) -> bool:
    """Some word ended up on the other side of two others that also crossed each other: in
    `order` (the candidate's order of the question's shared words), three positions fall. "is X
    bigger than Y" / "is Y bigger than X" crosses X and Y around "bigger"; moving one stretch of
    words elsewhere ("the hardest natural substance" / "natural substance ... the hardest"), or
    two ("a plan for a 30-day beginner strength program" / "a 30-day strength plan for a
    beginner"), never makes three fall."""
    later_min = [len(order)] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        later_min[i] = min(later_min[i + 1], order[i])
    earlier_max = -1
    for i, position in enumerate(order):
        if earlier_max > position > later_min[i + 1]:
            return True
        earlier_max = max(earlier_max, position)
    return False


def _occurrences(roles: tuple[tuple[str, str], ...], mine: Counter, theirs: Counter) -> list[tuple[str, int]]:
    """The content words that both sides say equally often, each with its occurrence: a word said
    twice on both sides ("Cai" in "Also Cai Feng had a son, Cai Mao" / "Cai Mao also had a son,
    Cai Feng") anchors the order as well as one said once."""
    seen: Counter[str] = Counter()
    out = []
    for word, _ in roles:
        seen[word] += 1
        if mine[word] == theirs[word]:
            out.append((word, seen[word]))
    return out


# From this many words on both sides, any reordering of shared words vetoes: a long statement
# rearranged ("X married Y's sister, who ..." / "Y married X's sister, who ...") usually swaps who
# did what, in ways no relation word names. Measured (docs/cache.md): PAWS look-alikes caught
# 74% -> 89%, PAWS paraphrases vetoed 14% -> 43%, chat and Quora questions (shorter) unchanged.
LONG_TEXT_WORDS = 15


def _rearranged(question: str, candidate: str) -> bool:
    """Long texts that share most content words, some of them in another order."""
    qa = [w for w in words_of(question) if w not in STOPWORDS]
    ca = [w for w in words_of(candidate) if w not in STOPWORDS]
    if min(len(words_of(question)), len(words_of(candidate))) < LONG_TEXT_WORDS:
        return False
    qs, cs = set(qa), set(ca)
    if not qs or not cs or len(qs & cs) / len(qs | cs) < ORDER_MIN_OVERLAP:
        return False
    shared = [w for w in qa if w in cs and qa.count(w) == 1 and ca.count(w) == 1]
    return len(shared) >= 2 and shared != [w for w in ca if w in shared]


def swapped(question: str, candidate: str) -> bool:
    """Two shared words traded places or roles: "flights from New York to Florida" / "from
    Florida to New York", "is X bigger than Y" / "is Y bigger than X", "impact of media on
    culture" / "of culture on media". A moved clause or adjective is no swap ("What is the hardest
    natural substance?" / "Which natural substance is the hardest?"), nor are the two sides of
    "X or Y", "X and Y", "X vs Y". Long statements: any rearrangement (`_rearranged`)."""
    q, c = details(question), details(candidate)
    if _traded(list(q.said), list(c.said)) or _rearranged(question, candidate):
        return True
    q_count, c_count = Counter(w for w, _ in q.roles), Counter(w for w, _ in c.roles)
    qs, cs = set(q_count), set(c_count)
    if not qs or not cs or len(qs & cs) / len(qs | cs) < ORDER_MIN_OVERLAP:
        return False
    shared = [w for w, _ in q.roles if q_count[w] == 1 and c_count[w] == 1]
    if _traded_roles(shared, dict(q.roles), dict(c.roles)):
        return True
    # A word brought to the front crosses everything it passes, and a rewording often fronts one
    # ("After cooking a steak, how long ...", "Mexico's tap water", "In the United States, ..."):
    # the first word of each side does not count.
    q_order, c_order = _occurrences(q.roles, q_count, c_count), _occurrences(c.roles, c_count, q_count)
    if len(q_order) < 3:
        return False
    kept = [w for w in q_order if w not in (q_order[0], c_order[0])]
    position = {w: i for i, w in enumerate(kept)}
    return _crossed([position[w] for w in c_order if w in position])


def conflicts(question: str, candidate: str) -> list[str]:
    """The names of the guards that veto serving `candidate`'s answer to `question`."""
    q, c = details(question), details(candidate)
    vetoes = []
    if _replaced(q.numbers, c.numbers):
        vetoes.append("numbers")
    if _replaced(q.dates, c.dates):
        vetoes.append("dates")
    # Counted, not as sets: "turn on dark mode on my iPhone" / "turn off ... on my iPhone" keeps
    # one "on" on both sides, and the other "on" became "off".
    qc, cc = Counter(q.said), Counter(c.said)
    fewer, more = qc - cc, cc - qc
    if q.negated != c.negated or _with_against_without(fewer, more):
        vetoes.append("negation")
    if _opposed(fewer, more):
        vetoes.append("opposites")
    if _names_differ(q, c):
        vetoes.append("entities")
    if swapped(question, candidate):
        vetoes.append("order")
    return vetoes




