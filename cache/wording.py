"""The forms in which one detail of a question can be written.

A rewording spells a number, a name or a date differently ("First World War" / "World War I",
"Kenya's" / "Kenya", "USA" / "United States"). The guards (cache/vetoes.py) compare details, not
spellings, so everything here turns a question into tokens and each detail into one canonical
value: a number into its value, a name into keys that its plural, possessive and demonym share.
"""
from __future__ import annotations

import re
from functools import lru_cache

# A token is a word (inner apostrophes and hyphens kept, outer quotes dropped), a number with its
# suffix ("60k", "4th", "77%"), or a punctuation mark that ends a clause or a sentence.
_TOKEN = re.compile(r"[A-Za-z](?:[A-Za-z'\-]*[A-Za-z])?"
                    r"|\d+(?:[.,]\d+)*(?:%|[kK]\b|st\b|nd\b|rd\b|th\b)?"
                    r"|[.,;:?!()\"]")
# Words that carry little of a question's subject: left out when comparing content words.
STOPWORDS = {
    "a", "an", "the", "is", "are", "was", "were", "be", "to", "of", "in", "on", "for", "and", "or", "i", "you",
    "my", "your", "it", "do", "does", "did", "can", "how", "what", "why", "which", "who", "when", "where",
    "should", "would", "will", "with", "from", "at", "by", "as", "that", "this", "me", "we", "there", "any",
    "best", "way", "ways", "good", "some", "get", "have", "has", "if", "about", "after", "most", "much", "many",
    "not", "no", "than", "more", "their", "they", "them", "its", "into", "like", "make", "one", "all",
}
# Capitalised words that name a role, not someone: "President Trump" and "Trump" name one person.
_TITLES = {"president", "presidency", "presidential", "prime", "minister", "pm", "king", "queen", "prince",
           "princess", "mr", "mrs", "ms", "dr", "sir", "lord", "professor", "prof", "governor", "senator", "chairman",
           "captain"}
# Small words inside a name's run of capitalised words: "World of Tanks" is "WoT" (or "WT").
_INSIDE_NAMES = {"of", "and", "the", "for", "&"}
SENTENCE_ENDS = {".", "?", "!", ":"}
CLAUSE_ENDS = SENTENCE_ENDS | {",", ";", "(", ")", '"'}
# The full stop of these ends no sentence: "St. Bernard", "Dr. Who", "Python vs. Java".
_ABBREVIATIONS = {"st", "mr", "mrs", "ms", "dr", "vs", "jr", "sr", "prof", "mt", "no", "fig"}

_CARDINALS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
}
_ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13, "fourteenth": 14, "fifteenth": 15,
    "sixteenth": 16, "seventeenth": 17, "eighteenth": 18, "nineteenth": 19, "twentieth": 20, "thirtieth": 30,
    "fortieth": 40, "fiftieth": 50, "hundredth": 100,
}
_MULTIPLIERS = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12}
# "one" is a pronoun more often than a number: "how can one learn", "which one", "each one", "the
# one movie that". After these words, or before a verb, it counts as no number.
_ONE_AS_PRONOUN_AFTER = {
    "can", "could", "should", "would", "may", "might", "must", "will", "does", "do", "did", "which", "each", "every",
    "any", "no", "some", "the", "this", "that", "another", "a", "such", "other", "only", "if", "when", "as", "one",
}
_ONE_AS_PRONOUN_BEFORE = {"is", "was", "can", "could", "should", "would", "will", "has", "does", "did", "who",
                          "that", "which", "must", "may", "might", "of", "another", "or", "and", "than"}
# Roman numerals are read only after a capitalised word ("World War I", "Henry VIII", "Part II"),
# and only from I, V and X: "CV", "MD", "DC" and "LCD" are acronyms far more often than numbers.
_ROMAN = re.compile(r"^(X{0,3})(IX|IV|V?I{0,3})$")
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10}
# After "World War I" the pronoun "I" would be followed by a lower-case verb ("in Paris I can").
_AFTER_ROMAN_I = {"and", "or", "vs", "of", "to", "in"}

MONTHS = {
    "jan": 1, "january": 1, "feb": 2, "february": 2, "mar": 3, "march": 3, "apr": 4, "april": 4, "may": 5,
    "jun": 6, "june": 6, "jul": 7, "july": 7, "aug": 8, "august": 8, "sep": 9, "sept": 9, "september": 9,
    "oct": 10, "october": 10, "nov": 11, "november": 11, "dec": 12, "december": 12,
}
# "may I", "march on": a month only when written as a name (capitalised, mid-sentence) or next to a
# number ("may 5", "5 march").
_MONTHS_ALSO_WORDS = {"may", "march", "mar"}
WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}

# Names written out or abbreviated: every form maps to the abbreviation. Forms are matched as whole
# token runs, case-insensitively, except those in _ONLY_UPPER ("US" the country, "us" the pronoun).
_SAME_NAME = {
    "USA": ["united states of america", "united states", "usa", "us", "america", "american", "americans"],
    "UK": ["united kingdom", "uk", "great britain", "britain", "british"],
    "UN": ["united nations", "un"],
    "EU": ["european union", "eu"],
    "UAE": ["united arab emirates", "uae"],
    "USSR": ["soviet union", "ussr"],
    "NYC": ["new york city", "new york", "nyc"],
    "LA": ["los angeles", "la"],
    "DC": ["washington dc", "washington d c", "dc"],
    "AI": ["artificial intelligence", "ai"],
    "ML": ["machine learning", "ml"],
    "CPU": ["central processing unit", "processor", "cpu"],
    "GPU": ["graphics processing unit", "graphics card", "gpu"],
    "RAM": ["random access memory", "ram"],
    "OS": ["operating system", "os"],
    "PC": ["personal computer", "pc"],
    "TV": ["television", "tv"],
    "DNA": ["deoxyribonucleic acid", "dna"],
    "GDP": ["gross domestic product", "gdp"],
    "CEO": ["chief executive officer", "ceo"],
    "WHO": ["world health organization", "world health organisation", "who"],
    "NASA": ["nasa"],
    "IT": ["information technology", "it"],
    "INR": ["indian rupee", "indian rupees", "rupee", "rupees", "rs", "inr"],
    "USD": ["us dollar", "us dollars", "usd"],
    "EUR": ["euro", "euros", "eur"],
    "GBP": ["british pound", "british pounds", "pound sterling", "pounds sterling", "gbp"],
    # Countries whose people or language are not named by an ending that `name_keys` strips.
    "Switzerland": ["switzerland", "swiss"],
    "Netherlands": ["netherlands", "the netherlands", "holland", "dutch"],
    "France": ["france", "french"],
    "Spain": ["spain", "spanish"],
    "Greece": ["greece", "greek"],
    "Sweden": ["sweden", "swedish", "swede", "swedes"],
    "Denmark": ["denmark", "danish"],
    "Finland": ["finland", "finnish"],
    "Poland": ["poland", "polish"],
    "Turkey": ["turkey", "turkish"],
    "Ireland": ["ireland", "irish"],
    "Scotland": ["scotland", "scottish", "scots"],
    "Thailand": ["thailand", "thai"],
    "Philippines": ["philippines", "filipino", "filipinos"],
    "Norway": ["norway", "norwegian", "norwegians"],
    "Peru": ["peru", "peruvian", "peruvians"],
}
_ONLY_UPPER = {"us", "la", "it", "who", "un", "os", "ram", "dc"}
# ... and those that are a name only when capitalised ("roast turkey", "polish the floor").
_ONLY_CAPITALISED = {"turkey", "polish"}
_NAME_FORMS: dict[tuple[str, ...], str] = {
    tuple(form.split()): short for short, forms in _SAME_NAME.items() for form in forms
}
_FORMS_STARTING: dict[str, list[tuple[str, ...]]] = {}
for _form in sorted(_NAME_FORMS, key=len, reverse=True):  # the longest form that fits wins
    _FORMS_STARTING.setdefault(_form[0], []).append(_form)
# "WWII", "WW2", "WW 1": the war's name and its number, as in "World War II".
_WORLD_WAR = re.compile(r"\bWW ?(II|I|1|2)\b")
# "401(k)", "403(b)": the plan's name, written as "401k".
_PLAN = re.compile(r"\b(\d+)\(([a-z])\)")
_DOTTED = re.compile(r"\b[A-Za-z](?:\.[A-Za-z])+\b\.?")
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "`": '"'})
# Endings that a name's demonym or plural adds: "Kenya"/"Kenyan", "Italy"/"Italian",
# "China"/"Chinese", "Quora"/"Quorans". Stripped only where at least four letters remain.
_NAME_ENDINGS = ("ians", "ans", "ns", "ese", "ian", "an", "n", "s")


def tokens_of(text: str) -> list[str]:
    """The question's tokens, in order, with curly quotes, dotted acronyms ("U.S.") and the
    world wars' short names ("WWII") written one way."""
    text = text.translate(_QUOTES)
    text = _PLAN.sub(r"\1\2", text)
    text = _DOTTED.sub(lambda m: m.group(0).replace(".", ""), text)
    text = _WORLD_WAR.sub(lambda m: "World War " + {"1": "I", "2": "II"}.get(m.group(1), m.group(1)), text)
    return _TOKEN.findall(text)


def is_word(token: str) -> bool:
    return token[0].isalpha()


def at_sentence_start(tokens: list[str], i: int) -> bool:
    if i == 0:
        return True
    return tokens[i - 1] in SENTENCE_ENDS and not (
        tokens[i - 1] == "." and i >= 2 and tokens[i - 2].lower() in _ABBREVIATIONS)


def plain(token: str) -> str:
    """A word in lower case without its possessive: "Kenya's" and "Adams'" are "kenya", "adams"."""
    word = token.lower()
    if word.endswith("'s"):
        word = word[:-2]
    return word.replace("'", "")


def _value(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _digits(token: str) -> float | None:
    scale = 1
    if token.endswith("k"):
        token, scale = token[:-1], 1000
    token = token.rstrip("%stndrh")
    try:
        return float(token.replace(",", "")) * scale
    except ValueError:
        return None


def _roman(tokens: list[str], i: int) -> int | None:
    token = tokens[i]
    if not token or not _ROMAN.match(token) or i == 0:
        return None
    before = tokens[i - 1]
    if not (is_word(before) and before[0].isupper() and before != "I"):
        return None
    if token == "I":
        # "Can I?", "Where in Paris I can ...": the pronoun.
        after = tokens[i + 1] if i + 1 < len(tokens) else "."
        if at_sentence_start(tokens, i - 1) or is_word(after) and after[0].islower() and after not in _AFTER_ROMAN_I:
            return None
    values = [_ROMAN_VALUES[c] for c in token]
    return sum(-v if j + 1 < len(values) and v < values[j + 1] else v for j, v in enumerate(values))


def _word_number(tokens: list[str], i: int) -> float | None:
    """The value of a number written in words, or None ("six-pack" is 6, "twenty-first" 21)."""
    word = tokens[i].lower()
    if word == "one":
        before = tokens[i - 1].lower() if i > 0 else ""
        after = tokens[i + 1].lower() if i + 1 < len(tokens) else "."
        if before in _ONE_AS_PRONOUN_AFTER or after in _ONE_AS_PRONOUN_BEFORE or not is_word(after):
            return None
    parts = word.split("-")
    if parts[0] not in _CARDINALS and parts[0] not in _ORDINALS:
        return None
    total = 0.0
    for part in parts:
        if part in _CARDINALS or part in _ORDINALS:
            total += _CARDINALS.get(part, _ORDINALS.get(part, 0))
        else:
            break
    return total


def numbers_of(tokens: list[str]) -> tuple[str, ...]:
    """Every number the question states, by value, in order, repeats kept ("a 12 ounce drink with
    6% alcohol" against "a 6 ounce drink with 12%" changes a count, not the set): "first", "1st",
    "one" and the "I" of "World War I" are all "1"; "two hundred" is "200", "60k" is "60000"; a
    version ("9.3.2") is kept as written."""
    values: list[float] = []
    versions: list[str] = []
    current: float | None = None
    current_is_word = False
    for i, token in enumerate(tokens):
        lowered = token.lower()
        if lowered in _MULTIPLIERS:
            current = (current or 1) * _MULTIPLIERS[lowered]
            current_is_word = False
            continue
        if token[0].isdigit():
            value, in_words = _digits(lowered), False
            if value is None:
                versions.append(token)
        elif is_word(token):
            value, in_words = _word_number(tokens, i), True
            if value is None:
                value, in_words = _roman(tokens, i), False
        else:
            value = None
        if value is None:
            if current is not None:
                values.append(current)
            current = None
            continue
        # "twenty one": the tens and the units of one number.
        if current is not None and current_is_word and in_words and current >= 20 and current % 10 == 0 and value < 10:
            current += value
            continue
        if current is not None:
            values.append(current)
        current, current_is_word = value, in_words
    if current is not None:
        values.append(current)
    return tuple(_value(v) for v in values) + tuple(versions)


def dates_of(tokens: list[str]) -> frozenset[str]:
    """Months (as numbers, "Sept" = "September") and weekdays the question names."""
    found = set()
    for i, token in enumerate(tokens):
        word = token.lower()
        if word in WEEKDAYS:
            found.add(word)
        elif word in MONTHS:
            if word in _MONTHS_ALSO_WORDS:
                near_number = any(0 <= j < len(tokens) and tokens[j][0].isdigit() for j in (i - 1, i + 1))
                named = token[0].isupper() and not at_sentence_start(tokens, i)
                if not (near_number or named):
                    continue
            found.add(f"month {MONTHS[word]}")
    return frozenset(found)


def with_names(tokens: list[str]) -> list[str]:
    """The tokens with every known form of a name replaced by its abbreviation ("United States",
    "America", "U.S." -> "USA"), so that both spellings compare equal."""
    words = [plain(t) for t in tokens]
    out: list[str] = []
    i = 0
    while i < len(tokens):
        for form in _FORMS_STARTING.get(words[i], ()):
            if tuple(words[i:i + len(form)]) != form:
                continue
            if len(form) == 1 and (form[0] in _ONLY_UPPER and not tokens[i].isupper()
                                   or form[0] in _ONLY_CAPITALISED and not tokens[i][0].isupper()):
                continue
            out.append(_NAME_FORMS[form])
            i += len(form)
            break
        else:
            out.append(tokens[i])
            i += 1
    return out


@lru_cache(maxsize=65536)
def name_keys(word: str) -> frozenset[str]:
    """The keys under which a name matches its other forms: plural, possessive and demonym endings
    stripped, and a final vowel ("Kenya" and "Kenyan" share "keny"; "Austria" and "Australia" share
    none)."""
    word = plain(word)
    keys = {word, re.sub(r"(.)\1", r"\1", word)}  # "Hillary" / "Hilary"
    if len(word) >= 5:  # two letters typed the wrong way round: "Dlehi", "Chiense"
        keys.add(f"{word[0]}~{''.join(sorted(word[1:-1]))}~{word[-1]}")
    for ending in _NAME_ENDINGS:
        if word.endswith(ending) and len(word) - len(ending) >= 4:
            keys.add(word[: -len(ending)])
    keys |= {k[:-1] for k in keys if k[-1] in "aeiouy" and len(k) > 4}
    return frozenset(keys)


def looks_numeric(token: str) -> bool:
    """A word that can state a number ("First", "Twenty-one", "VIII"): not a name."""
    word = token.lower().split("-")[0]
    numeral = token.isupper() and bool(_ROMAN.match(token))
    return word in _CARDINALS or word in _ORDINALS or word in _MULTIPLIERS or numeral


def _singular_acronym(token: str) -> str:
    """"IQs", "CPUs": the acronym."""
    return token[:-1] if len(token) > 2 and token[-1] == "s" and token[:-1].isupper() else token


def names_of(tokens: list[str]) -> frozenset[str]:
    """The names the question uses: capitalised words that do not start a sentence, and acronyms
    (2FA, iOS, USA) anywhere; never a function word ("It", "The"), a title ("President") or a
    number ("First", "VIII")."""
    names = set()
    for i, token in enumerate(tokens):
        if not is_word(token) or looks_numeric(token):
            continue
        token = _singular_acronym(token)
        word = plain(token)
        if word in STOPWORDS or word in _TITLES:
            continue
        acronym = len(token) > 1 and sum(c.isupper() for c in token) >= 2
        if acronym or (token[0].isupper() and not at_sentence_start(tokens, i)):
            names.add(word)
    return frozenset(names)


def mentions_of(tokens: list[str], named: list[str]) -> frozenset[str]:
    """Every key under which the question mentions something, in any of its forms: each word's
    name keys, a hyphenated word's parts and the parts joined ("Trans-Pacific", "Pit Bull" /
    "Pitbull"), the initials of a run of capitalised words ("International Phonetic Alphabet" is
    "IPA"), and the abbreviations that `with_names` put in."""
    words = [plain(_singular_acronym(t)) for t in tokens + named if t[0].isalnum()]
    forms = set(words)
    for word in words:
        if "-" in word:
            forms |= set(word.split("-")) | {word.replace("-", "")}
    forms |= {a + b for a, b in zip(words, words[1:])}
    run: list[str] = []
    for token in tokens + ["."]:
        if is_word(token) and (token[0].isupper() and plain(token) not in STOPWORDS or run and token in _INSIDE_NAMES):
            run.append(token)
            continue
        while run and run[-1] in _INSIDE_NAMES:
            run.pop()
        if len(run) >= 2:
            forms.add("".join(t[0] for t in run).lower())
            forms.add("".join(t[0] for t in run if t not in _INSIDE_NAMES).lower())
        run = []
    return frozenset(key for form in forms if form for key in name_keys(form))


def mentioned(name: str, mentions: frozenset[str]) -> bool:
    """`name`, or each part of a hyphenated name ("Jong-un" in "Kim Jong Un"), is mentioned."""
    if name_keys(name) & mentions:
        return True
    parts = [p for p in name.split("-") if p]
    return len(parts) > 1 and all(name_keys(p) & mentions for p in parts)
