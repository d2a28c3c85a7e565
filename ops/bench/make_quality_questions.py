# Over 400 lines: the question templates of every category, each beside the facts it asks; their output is bench/data/quality_questions.jsonl.
"""Writes ops/bench/data/quality_questions.jsonl, the question set of `brigade bench quality`.

The facts, yes/no and multiple-choice questions below were written by hand for Brigade (no outside
question set, so no licence doubts); the arithmetic and unit-conversion questions are generated
here from a fixed seed. The JSONL is committed: rerun this script only to change the set
(`python -m ops.bench.make_quality_questions`), and say so in the commit, since figures measured on
one version of the set do not compare with another's.

Every line: id, category, kind (how its answer is checked: words, number, yes_no or choice),
question, answers (accepted words or numbers), and where needed rejected words or choices.

It is long for the hand-written questions it holds (data, one table per category), not for its logic.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "quality_questions.jsonl"

# (question, accepted answers). Easy on purpose: a 135M model should get a good share right, so
# that a precision mode that loses accuracy shows it.
FACTS: dict[str, list[tuple[str, list[str]]]] = {
    "capital": [
        ("What is the capital of France?", ["Paris"]),
        ("What is the capital of Germany?", ["Berlin"]),
        ("What is the capital of Italy?", ["Rome"]),
        ("What is the capital of Spain?", ["Madrid"]),
        ("What is the capital of Japan?", ["Tokyo"]),
        ("What is the capital of China?", ["Beijing", "Peking"]),
        ("What is the capital of Russia?", ["Moscow"]),
        ("What is the capital of the United Kingdom?", ["London"]),
        ("What is the capital of England?", ["London"]),
        ("What is the capital of Egypt?", ["Cairo"]),
        ("What is the capital of Canada?", ["Ottawa"]),
        ("What is the capital of Australia?", ["Canberra"]),
        ("What is the capital of India?", ["New Delhi", "Delhi"]),
        ("What is the capital of Brazil?", ["Brasilia"]),
        ("What is the capital of Mexico?", ["Mexico City"]),
        ("What is the capital of Argentina?", ["Buenos Aires"]),
        ("What is the capital of Portugal?", ["Lisbon"]),
        ("What is the capital of Greece?", ["Athens"]),
        ("What is the capital of Ireland?", ["Dublin"]),
        ("What is the capital of Norway?", ["Oslo"]),
        ("What is the capital of Sweden?", ["Stockholm"]),
        ("What is the capital of Finland?", ["Helsinki"]),
        ("What is the capital of Denmark?", ["Copenhagen"]),
        ("What is the capital of the Netherlands?", ["Amsterdam"]),
        ("What is the capital of Belgium?", ["Brussels"]),
        ("What is the capital of Austria?", ["Vienna"]),
        ("What is the capital of Poland?", ["Warsaw"]),
        ("What is the capital of Hungary?", ["Budapest"]),
        ("What is the capital of the Czech Republic?", ["Prague"]),
        ("What is the capital of Turkey?", ["Ankara"]),
        ("What is the capital of South Korea?", ["Seoul"]),
        ("What is the capital of Thailand?", ["Bangkok"]),
        ("What is the capital of Kenya?", ["Nairobi"]),
        ("What is the capital of Peru?", ["Lima"]),
        ("What is the capital of Cuba?", ["Havana"]),
        ("What is the capital of Iran?", ["Tehran"]),
        ("What is the capital of Vietnam?", ["Hanoi"]),
        ("What is the capital of Indonesia?", ["Jakarta"]),
        ("What is the capital of the Philippines?", ["Manila"]),
        ("What is the capital of Ukraine?", ["Kyiv", "Kiev"]),
        ("What is the capital of Scotland?", ["Edinburgh"]),
        ("What is the capital of the United States?", ["Washington"]),
    ],
    "space": [
        ("Which planet is known as the Red Planet?", ["Mars"]),
        ("What is the largest planet in our solar system?", ["Jupiter"]),
        ("Which planet is closest to the Sun?", ["Mercury"]),
        ("Which planet has the most famous rings?", ["Saturn"]),
        ("What planet do we live on?", ["Earth"]),
        ("What is the name of the star at the centre of our solar system?", ["Sun"]),
        ("What is the natural satellite of the Earth called?", ["Moon"]),
        ("How many planets are in our solar system?", ["8", "eight"]),
        ("Which planet is third from the Sun?", ["Earth"]),
        ("What is the name of our galaxy?", ["Milky Way"]),
        ("Which planet is the hottest in our solar system?", ["Venus"]),
        ("Who was the first person to walk on the Moon?", ["Armstrong"]),
        ("What force keeps the planets in orbit around the Sun?", ["gravity", "gravitational"]),
        ("Which planet is farthest from the Sun?", ["Neptune"]),
        ("What do we call a rock from space that lands on Earth?", ["meteorite"]),
        ("Roughly how many days does the Earth take to go around the Sun?", ["365", "365.25"]),
    ],
    "chemistry": [
        ("What is the chemical symbol for gold?", ["Au"]),
        ("What is the chemical symbol for silver?", ["Ag"]),
        ("What is the chemical symbol for iron?", ["Fe"]),
        ("What is the chemical symbol for oxygen?", ["O"]),
        ("What is the chemical symbol for hydrogen?", ["H"]),
        ("What is the chemical symbol for carbon?", ["C"]),
        ("What is the chemical symbol for nitrogen?", ["N"]),
        ("What is the chemical symbol for sodium?", ["Na"]),
        ("What is the chemical symbol for helium?", ["He"]),
        ("What is the chemical symbol for copper?", ["Cu"]),
        ("What is the chemical symbol for potassium?", ["K"]),
        ("What is the chemical symbol for calcium?", ["Ca"]),
        ("What is the chemical formula of water?", ["H2O", "H₂O"]),
        ("What is the chemical formula of carbon dioxide?", ["CO2", "CO₂"]),
        ("Which gas do humans need to breathe to stay alive?", ["oxygen"]),
        ("Which element has the atomic number 1?", ["hydrogen"]),
        ("Which gas makes up most of the Earth's atmosphere?", ["nitrogen"]),
        ("What is the chemical symbol for lead?", ["Pb"]),
        ("What is the chemical symbol for zinc?", ["Zn"]),
        ("Which metal is liquid at room temperature?", ["mercury"]),
    ],
    "author": [
        ("Who wrote 'Romeo and Juliet'?", ["Shakespeare"]),
        ("Who wrote 'Hamlet'?", ["Shakespeare"]),
        ("Who wrote 'Pride and Prejudice'?", ["Austen"]),
        ("Who wrote the novel '1984'?", ["Orwell"]),
        ("Who wrote 'Animal Farm'?", ["Orwell"]),
        ("Who wrote the Harry Potter books?", ["Rowling"]),
        ("Who wrote 'Oliver Twist'?", ["Dickens"]),
        ("Who wrote 'A Christmas Carol'?", ["Dickens"]),
        ("Who wrote 'The Adventures of Tom Sawyer'?", ["Twain", "Clemens"]),
        ("Who wrote 'War and Peace'?", ["Tolstoy"]),
        ("Who wrote 'The Lord of the Rings'?", ["Tolkien"]),
        ("Who wrote 'The Hobbit'?", ["Tolkien"]),
        ("Who wrote 'Don Quixote'?", ["Cervantes"]),
        ("Who wrote 'The Old Man and the Sea'?", ["Hemingway"]),
        ("Who wrote 'Frankenstein'?", ["Mary Shelley", "Shelley"]),
        ("Who created the detective Sherlock Holmes?", ["Conan Doyle", "Arthur Doyle", "Doyle"]),
        ("Who wrote 'Alice's Adventures in Wonderland'?", ["Lewis Carroll", "Carroll"]),
        ("Who wrote 'Macbeth'?", ["Shakespeare"]),
        ("Who wrote 'The Odyssey'?", ["Homer"]),
        ("Who wrote 'Great Expectations'?", ["Dickens"]),
        ("Who painted the Mona Lisa?", ["Leonardo", "da Vinci"]),
        ("Who developed the theory of relativity?", ["Einstein"]),
        ("Who wrote 'Charlie and the Chocolate Factory'?", ["Dahl"]),
    ],
    "colour": [
        ("What colour is the sky on a clear day?", ["blue"]),
        ("What colour is grass?", ["green"]),
        ("What colour is a ripe banana?", ["yellow"]),
        ("What colour is snow?", ["white"]),
        ("What colour is coal?", ["black"]),
        ("What colour is a ripe tomato?", ["red"]),
        ("What colour do you get when you mix blue and yellow?", ["green"]),
        ("What colour do you get when you mix red and white?", ["pink"]),
        ("What colour do you get when you mix red and yellow?", ["orange"]),
        ("What colour do you get when you mix black and white?", ["grey", "gray"]),
        ("What colour do you get when you mix red and blue?", ["purple", "violet"]),
        ("What colour is an orange?", ["orange"]),
        ("What colour are most leaves in summer?", ["green"]),
        ("What colour is milk?", ["white"]),
        ("What colour is a fire engine usually?", ["red"]),
        ("What colour is a lemon?", ["yellow"]),
        ("What colour is the middle light of a traffic light?", ["yellow", "amber", "orange"]),
        ("What colour is chocolate?", ["brown"]),
        ("What colour are emeralds?", ["green"]),
        ("What colour are the clouds before a storm?", ["grey", "gray", "dark", "black"]),
        ("What colour is a flamingo?", ["pink"]),
        ("What colour is the sea usually said to be?", ["blue"]),
    ],
    "animal": [
        ("What animal says 'moo'?", ["cow", "cows", "cattle"]),
        ("What animal says 'woof'?", ["dog", "dogs"]),
        ("What animal says 'meow'?", ["cat", "cats"]),
        ("What is a baby cat called?", ["kitten"]),
        ("What is a baby dog called?", ["puppy", "pup"]),
        ("What is a baby cow called?", ["calf"]),
        ("What is a baby sheep called?", ["lamb"]),
        ("Which animal is known as the king of the jungle?", ["lion"]),
        ("What is the largest animal on Earth?", ["blue whale"]),
        ("What is the fastest land animal?", ["cheetah"]),
        ("Which animal has a very long neck and lives in Africa?", ["giraffe"]),
        ("Which bird is a symbol of peace?", ["dove"]),
        ("What do bees make?", ["honey"]),
        ("What do caterpillars turn into?", ["butterfly", "butterflies", "moth", "moths"]),
        ("Which animal is known for carrying its house on its back?", ["snail", "tortoise", "turtle"]),
        ("Which black and white bear eats bamboo?", ["panda"]),
        ("Which animal has a trunk?", ["elephant"]),
        ("What do you call a young frog?", ["tadpole"]),
        ("Which bird cannot fly and lives in Antarctica?", ["penguin"]),
        ("Which animal is famous for changing its colour?", ["chameleon"]),
        ("What is the largest land animal?", ["elephant"]),
        ("Which animal is known as man's best friend?", ["dog"]),
        ("What animal has black and white stripes and lives in Africa?", ["zebra"]),
        ("What do cows drink?", ["water"]),
        ("Which sea animal has eight arms?", ["octopus"]),
        ("Which insect makes a web?", ["spider"]),
    ],
    "science": [
        ("At what temperature in degrees Celsius does water boil at sea level?", ["100"]),
        ("At what temperature in degrees Celsius does water freeze?", ["0", "zero"]),
        ("What gas do plants take in from the air to make food?", ["carbon dioxide", "CO2"]),
        ("What gas do plants give off?", ["oxygen"]),
        ("What is frozen water called?", ["ice"]),
        ("What is the boiling point of water in Fahrenheit?", ["212"]),
        ("How many days are in a week?", ["7", "seven"]),
        ("How many months are in a year?", ["12", "twelve"]),
        ("How many hours are in a day?", ["24", "twenty-four"]),
        ("How many legs does a spider have?", ["8", "eight"]),
        ("How many legs does an insect have?", ["6", "six"]),
        ("How many sides does a triangle have?", ["3", "three"]),
        ("How many sides does a hexagon have?", ["6", "six"]),
        ("How many continents are there?", ["7", "seven"]),
        ("What organ pumps blood around the body?", ["heart"]),
        ("What organ do we use to think?", ["brain"]),
        ("Which organ do humans use to breathe?", ["lungs", "lung"]),
        ("What is the hardest natural substance?", ["diamond"]),
        ("What is the largest ocean on Earth?", ["Pacific"]),
        ("What is the tallest mountain in the world?", ["Everest"]),
        ("What is the longest river in the world?", ["Nile", "Amazon"]),
        ("What do we call the process by which plants make food from sunlight?", ["photosynthesis"]),
        ("What is the centre of an atom called?", ["nucleus"]),
        ("What instrument do we use to measure temperature?", ["thermometer"]),
        ("What is the main source of light for the Earth during the day?", ["Sun", "sunlight"]),
        ("How many bones are in the adult human body?", ["206"]),
        ("What is the opposite of hot?", ["cold"]),
        ("What is the opposite of up?", ["down"]),
        ("In which season do leaves fall from the trees?", ["autumn", "fall"]),
        ("Which is the coldest season of the year?", ["winter"]),
        ("What do you call the liquid that falls from clouds?", ["rain"]),
        ("What is the freezing point of water in Fahrenheit?", ["32"]),
        ("What language is spoken in France?", ["French"]),
        ("In which country are the pyramids of Giza?", ["Egypt"]),
        ("In which city is the Eiffel Tower?", ["Paris"]),
        ("What currency is used in Japan?", ["yen"]),
        ("How many strings does a standard guitar have?", ["6", "six"]),
        ("What is the square root of 81?", ["9", "nine"]),
    ],
}

# (question, "yes" or "no"): about half each, so that always answering one word scores about half.
YES_NO: list[tuple[str, str]] = [
    ("Is the Sun a star?", "yes"),
    ("Do penguins fly?", "no"),
    ("Is the Earth flat?", "no"),
    ("Is Paris in France?", "yes"),
    ("Is a whale a fish?", "no"),
    ("Do cats have four legs?", "yes"),
    ("Is 7 an even number?", "no"),
    ("Is 10 greater than 5?", "yes"),
    ("Is the Moon bigger than the Earth?", "no"),
    ("Does the Sun rise in the east?", "yes"),
    ("Is fire hot?", "yes"),
    ("Can people breathe in space without a space suit?", "no"),
    ("Do spiders have six legs?", "no"),
    ("Is gold a metal?", "yes"),
    ("Is London the capital of France?", "no"),
    ("Does water freeze at 0 degrees Celsius?", "yes"),
    ("Are bananas blue?", "no"),
    ("Is Mount Everest the tallest mountain on Earth?", "yes"),
    ("Is ice colder than boiling water?", "yes"),
    ("Is 3 larger than 9?", "no"),
    ("Do fish live in water?", "yes"),
    ("Is the Pacific the smallest ocean?", "no"),
]

# (question, choices, the right letter): the prompt lists the choices and asks for a letter.
CHOICE: list[tuple[str, dict[str, str], str]] = [
    ("Which planet is the largest?", {"A": "Mars", "B": "Jupiter", "C": "Venus", "D": "Mercury"}, "B"),
    ("What is the capital of Italy?", {"A": "Milan", "B": "Venice", "C": "Rome", "D": "Naples"}, "C"),
    ("Which animal is a mammal?", {"A": "Shark", "B": "Dolphin", "C": "Trout", "D": "Octopus"}, "B"),
    ("What colour is the sky on a clear day?", {"A": "Blue", "B": "Green", "C": "Red", "D": "Purple"}, "A"),
    ("How many legs does a dog have?", {"A": "Two", "B": "Six", "C": "Eight", "D": "Four"}, "D"),
    ("Which of these is a fruit?", {"A": "Carrot", "B": "Apple", "C": "Potato", "D": "Onion"}, "B"),
    ("What is 5 + 3?", {"A": "6", "B": "7", "C": "8", "D": "9"}, "C"),
    ("Which gas do plants take in?", {"A": "Oxygen", "B": "Helium", "C": "Carbon dioxide", "D": "Neon"}, "C"),
    ("Who wrote 'Hamlet'?", {"A": "Charles Dickens", "B": "William Shakespeare", "C": "Mark Twain", "D": "Jane Austen"}, "B"),
    ("What is frozen water called?", {"A": "Steam", "B": "Ice", "C": "Fog", "D": "Sand"}, "B"),
    ("Which is the closest planet to the Sun?", {"A": "Mercury", "B": "Earth", "C": "Neptune", "D": "Saturn"}, "A"),
    ("What is the chemical symbol for water?", {"A": "CO2", "B": "O2", "C": "NaCl", "D": "H2O"}, "D"),
    ("Which ocean is the largest?", {"A": "Indian", "B": "Arctic", "C": "Pacific", "D": "Atlantic"}, "C"),
    ("How many days are in a week?", {"A": "Five", "B": "Seven", "C": "Ten", "D": "Twelve"}, "B"),
    ("What is the capital of Japan?", {"A": "Tokyo", "B": "Osaka", "C": "Kyoto", "D": "Seoul"}, "A"),
    ("Which animal says 'moo'?", {"A": "Dog", "B": "Cat", "C": "Cow", "D": "Duck"}, "C"),
    ("What do bees make?", {"A": "Milk", "B": "Honey", "C": "Silk", "D": "Wool"}, "B"),
    ("Which is the largest land animal?", {"A": "Mouse", "B": "Horse", "C": "Lion", "D": "Elephant"}, "D"),
    ("What is 3 x 4?", {"A": "12", "B": "7", "C": "10", "D": "14"}, "A"),
    ("Which season comes after winter?", {"A": "Autumn", "B": "Summer", "C": "Spring", "D": "Winter"}, "C"),
]

WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen twenty").split()


def number_answers(value: int) -> list[str]:
    """The number, and its word for the small ones (a model may write either)."""
    return [str(value)] + ([WORDS[value]] if value < len(WORDS) else [])


def arithmetic(rng: random.Random) -> list[dict]:
    out: list[dict] = []
    forms = {
        "add": ["What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}. What is the result?"],
        "subtract": ["What is {a} - {b}?", "What is {a} minus {b}?"],
        "multiply": ["What is {a} x {b}?", "What is {a} times {b}?", "What is {a} multiplied by {b}?"],
        "divide": ["What is {a} divided by {b}?"],
    }
    seen: set[str] = set()
    plan = [("add", 22), ("subtract", 14), ("multiply", 18), ("divide", 8)]
    for op, count in plan:
        made = 0
        while made < count:
            if op == "add":
                a, b = rng.randint(1, 30), rng.randint(1, 30)
                value = a + b
            elif op == "subtract":
                a = rng.randint(5, 40)
                b = rng.randint(1, a - 1)
                value = a - b
            elif op == "multiply":
                a, b = rng.randint(2, 12), rng.randint(2, 10)
                value = a * b
            else:
                b, value = rng.randint(2, 10), rng.randint(2, 10)
                a = b * value
            # The answer must not be one of the question's own numbers: an answer that only repeats
            # the question would otherwise count as right.
            if value in (a, b):
                continue
            question = rng.choice(forms[op]).format(a=a, b=b)
            if question in seen:
                continue
            seen.add(question)
            out.append({"category": "arithmetic", "kind": "number", "question": question,
                        "answers": number_answers(value)})
            made += 1
    return out


# (unit asked for, unit given, factor, given values): "How many {to} are in {n} {from}?"
CONVERSIONS = [
    ("centimetres", "metres", 100, [1, 2, 3, 5]),
    ("millimetres", "centimetres", 10, [2, 4, 7]),
    ("metres", "kilometres", 1000, [1, 2, 3, 5]),
    ("grams", "kilograms", 1000, [1, 2, 4]),
    ("millilitres", "litres", 1000, [1, 2, 3]),
    ("minutes", "hours", 60, [1, 2, 3, 5]),
    ("seconds", "minutes", 60, [1, 2, 4]),
    ("hours", "days", 24, [1, 2, 3]),
    ("days", "weeks", 7, [2, 3, 4]),
    ("months", "years", 12, [2, 3, 5]),
    ("eggs", "dozen", 12, [2, 3]),
]
# Downward conversions: "How many {to} are in {n} {from}?" with n a multiple of the factor.
DOWNWARD = [
    ("metres", "centimetres", 100, [200, 300, 500]),
    ("kilometres", "metres", 1000, [2000, 3000]),
    ("hours", "minutes", 60, [120, 180]),
    ("weeks", "days", 7, [14, 21]),
    ("minutes", "seconds", 60, [120]),
]


def units() -> list[dict]:
    out = []
    for to, given, factor, values in CONVERSIONS:
        for n in values:
            unit = given[:-1] if n == 1 and given.endswith("s") else given
            out.append({"category": "units", "kind": "number", "question": f"How many {to} are in {n} {unit}?",
                        "answers": number_answers(n * factor)})
    for to, given, factor, values in DOWNWARD:
        for n in values:
            out.append({"category": "units", "kind": "number", "question": f"How many {to} are in {n} {given}?",
                        "answers": number_answers(n // factor)})
    return out


def is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def build() -> list[dict]:
    rows: list[dict] = []
    for category, items in FACTS.items():
        for question, answers in items:
            kind = "number" if any(is_number(a) for a in answers) else "words"
            rows.append({"category": category, "kind": kind, "question": question, "answers": answers})
    for question, answer in YES_NO:
        rows.append({"category": "yes_no", "kind": "yes_no", "question": f"{question} Answer yes or no.",
                     "answers": [answer]})
    for question, choices, letter in CHOICE:
        listed = " ".join(f"{k}) {v}" for k, v in choices.items())
        rows.append({"category": "choice", "kind": "choice",
                     "question": f"{question} {listed}. Answer with the letter of the right option.",
                     "answers": [letter, choices[letter]], "choices": choices})
    rng = random.Random(18)  # issue 18: a fixed seed, so that rerunning writes the same set
    rows += arithmetic(rng)
    rows += units()
    counters: dict[str, int] = {}
    numbered = []
    for row in rows:
        counters[row["category"]] = counters.get(row["category"], 0) + 1
        numbered.append({"id": f"{row['category']}-{counters[row['category']]:03d}", **row})
    return numbered


def main() -> None:
    rows = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} questions -> {OUT}")


if __name__ == "__main__":
    main()
