"""A synthetic world of fictional people and towns: the embedded default data of the "knowledge" experiment.

Every person has a unique made-up name, a birthplace, a different town where they live or work (and one
where they studied: never the birthplace, now and then the town they live in), a profession and a birth year.
Each person gets a one-line biography in one of several phrasings, in the style of the CS224n 2021 a5
corpus, for example::

    Nian Adbranani. Nian Adbranani is a painter born in Nevdal . He lives in Lunix .

(from ``make_world(40, seed=3)``) and a question ``Where was Nian Adbranani born?`` whose answer is the
birthplace. The biographies of everyone form the pretraining corpus; the questions are split into fine-tuning
and evaluation sets by person, so answering an evaluation question requires knowledge the model could only
have got from pretraining.

Everything is drawn from `random.Random` generators seeded with integers and strings, whose streams Python
keeps stable across versions and machines; nothing depends on `hash()` or set order.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from itertools import accumulate
from os import PathLike
from pathlib import Path

from attnlab.errors import ConfigError
from attnlab.files import write_text_atomic

WORLD_MARK = "world.json"  # written beside a generated world's files (see `World.write`)

N_PLACES = 400  # towns in every world; birthplaces follow a mild Zipf law over them (the top one ≈ 2.7 %)
ZIPF_OFFSET = 10  # town k is chosen with weight 1 / (k + ZIPF_OFFSET)

# Syllables for people's names: a first name is one or two syllables and an ending, a surname one or two
# syllables and a surname ending, which gives over a hundred million distinct full names.
_FIRST_SYLLABLES = (
    "a",
    "be",
    "ca",
    "da",
    "el",
    "fe",
    "ga",
    "hi",
    "i",
    "jo",
    "ka",
    "li",
    "ma",
    "ni",
    "o",
    "pe",
    "ra",
    "si",
    "ta",
    "u",
    "ve",
    "wy",
    "ya",
    "zo",
    "ri",
    "lan",
    "mir",
    "dor",
    "len",
    "sa",
    "tor",
    "vin",
    "nel",
    "ren",
    "tha",
    "mae",
    "ko",
    "lu",
    "bel",
    "cor",
)
_FIRST_ENDINGS = ("a", "o", "en", "is", "an", "el", "in", "ie", "us", "yn", "ra", "ette", "ia", "on")
_LAST_SYLLABLES = (
    "ab",
    "bran",
    "cal",
    "dun",
    "es",
    "fal",
    "gor",
    "hal",
    "ir",
    "kest",
    "lor",
    "mund",
    "nor",
    "ost",
    "pell",
    "quin",
    "ros",
    "sten",
    "tar",
    "ul",
    "var",
    "wen",
    "yor",
    "zan",
    "ad",
    "em",
    "ot",
    "brin",
    "cass",
    "del",
)
_LAST_ENDINGS = (
    "velt",
    "mark",
    "son",
    "dell",
    "worth",
    "ley",
    "ani",
    "ez",
    "ova",
    "berg",
    "ler",
    "ski",
    "ard",
    "ine",
    "ow",
    "ett",
    "ic",
    "aro",
    "en",
    "is",
)

# Syllables for towns: a start, an optional middle and a town ending, sometimes behind a prefix.
_PLACE_STARTS = (
    "tov",
    "quen",
    "mar",
    "bel",
    "cor",
    "dra",
    "el",
    "fen",
    "gal",
    "hor",
    "is",
    "kel",
    "lun",
    "mor",
    "nev",
    "or",
    "pra",
    "ros",
    "sal",
    "tir",
    "ul",
    "val",
    "wes",
    "yar",
    "zel",
    "ash",
    "brig",
    "cald",
)
_PLACE_MIDDLES = ("", "", "", "a", "e", "i", "o", "an", "er", "il")
_PLACE_ENDINGS = (
    "riss",
    "dal",
    "mouth",
    "holm",
    "gard",
    "vale",
    "wick",
    "stead",
    "burg",
    "ora",
    "ix",
    "ene",
    "mar",
    "port",
    "heim",
    "ssa",
    "ovo",
    "ain",
    "ford",
    "ley",
    "ton",
    "mere",
)
_PLACE_PREFIXES = ("Port ", "Saint ", "Upper ", "Lower ", "New ", "East ", "West ", "North ")

PROFESSIONS = (
    "painter",
    "engineer",
    "poet",
    "architect",
    "botanist",
    "cartographer",
    "violinist",
    "surgeon",
    "astronomer",
    "historian",
    "sculptor",
    "chemist",
    "novelist",
    "carpenter",
    "diplomat",
    "linguist",
    "mathematician",
    "photographer",
    "pharmacist",
    "judge",
    "teacher",
    "economist",
    "geologist",
    "journalist",
    "actor",
    "composer",
    "baker",
    "weaver",
    "sailor",
    "inventor",
)

# One-line biographies in the a5 corpus style: "Name. sentences", spaces before punctuation after names.
# Fields: name, Pron/pron (she, he), poss (her, his), a_prof ("a painter"), prof, birth, home, study, year.
TEMPLATES = (
    # "Name. " and then a short line (the assignment's corpus format) that mostly names the birthplace
    # early: the assignment's truncation (a random length up to 7/8 of the block) then keeps it in most
    # samples. Every line also names a distractor town.
    "{name}. {name} was born in {birth} and works in {home} .",
    "{name}. {name} , born in {birth} , lives in {home} .",
    "{name}. Born in {birth} , {name} became {a_prof} in {home} .",
    "{name}. {name} is {a_prof} born in {birth} . {Pron} lives in {home} .",
    "{name}. {name} ( born {year} in {birth} ) studied in {study} and lives in {home} .",
    "{name}. {name} , {a_prof} born in {birth} , moved to {home} .",
    "{name}. {name} lives in {home} but was born in {birth} .",
    "{name}. In {year} {name} was born in {birth} ; {pron} works in {home} .",
)


@dataclass(frozen=True)
class Person:
    """One fictional person and the facts their biography states."""

    name: str
    pronoun: str  # "she" or "he"
    birthplace: str
    home: str  # where they live or work: a distractor, never the birthplace
    studied_in: str  # a second distractor, never the birthplace
    profession: str
    birth_year: int
    biography: str
    template: int  # index into TEMPLATES of the biography's phrasing

    @property
    def question(self) -> str:
        return f"Where was {self.name} born?"

    @property
    def answer(self) -> str:
        return self.birthplace


@dataclass(frozen=True)
class World:
    """The people of a synthetic world (see `make_world`), the towns, and the seed they came from."""

    people: tuple[Person, ...]
    places: tuple[str, ...]
    seed: int

    def corpus_lines(self) -> list[str]:
        """Every person's biography, in a shuffled order fixed by the world's seed."""
        lines = [p.biography for p in self.people]
        random.Random(f"attnlab.world/{self.seed}/corpus").shuffle(lines)
        return lines

    def split(
        self, eval_fraction: float = 0.2, seed: int = 0
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Questions split by person into (fine-tuning pairs, evaluation pairs).

        No evaluation person appears in the fine-tuning pairs; everyone's biography is in the corpus.

        Args:
            eval_fraction: share of people asked about only at evaluation, strictly between 0 and 1.
            seed: seed of the split.
        """
        if not 0 < eval_fraction < 1:
            raise ConfigError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction!r}")
        if len(self.people) < 2:
            raise ConfigError("a world needs at least 2 people to split; raise n_people")
        order = list(range(len(self.people)))
        random.Random(f"attnlab.world/{self.seed}/split/{seed}").shuffle(order)
        n_eval = min(max(round(len(order) * eval_fraction), 1), len(order) - 1)
        pairs = [(self.people[i].question, self.people[i].answer) for i in order]
        return pairs[n_eval:], pairs[:n_eval]

    @staticmethod
    def paths(folder: str | PathLike[str]) -> dict[str, Path]:
        """The paths `write` gives the corpus and the question files in `folder`, by name."""
        out = Path(folder)
        return {"corpus": out / "corpus.txt", "train": out / "train.tsv", "dev": out / "dev.tsv"}

    def files(self, eval_fraction: float = 0.2, seed: int = 0) -> dict[str, str]:
        """The contents `write` gives each file, by file name: ``corpus.txt`` (one biography a line), ``train.tsv``
        and ``dev.tsv`` (``question<TAB>answer`` lines), and WORLD_MARK, the mark that they were generated (files
        of the user's with the same names were taken for a world and deleted), with the world's recipe."""
        train, dev = self.split(eval_fraction, seed)
        recipe = {"written_by": "attnlab run knowledge", "n_people": len(self.people), "seed": self.seed,
                  "eval_fraction": eval_fraction, "split_seed": seed}
        return {"corpus.txt": "".join(line + "\n" for line in self.corpus_lines()),
                "train.tsv": "".join(f"{q}\t{a}\n" for q, a in train),
                "dev.tsv": "".join(f"{q}\t{a}\n" for q, a in dev),
                WORLD_MARK: json.dumps(recipe, indent=2) + "\n"}

    def write(
        self, folder: str | PathLike[str], eval_fraction: float = 0.2, seed: int = 0
    ) -> dict[str, Path]:
        """Write `files` into `folder`, creating it; returns the paths of the corpus and the question files by
        name (see `paths`)."""
        write_files(folder, self.files(eval_fraction, seed))
        return self.paths(folder)


def write_files(folder: str | PathLike[str], files: dict[str, str]) -> None:
    """Write `files` (texts by file name, as `World.files` gives them) into `folder`, creating it."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_text_atomic(Path(folder) / name, text)


def _make_places(rng: random.Random, n: int) -> list[str]:
    places: list[str] = []
    seen = {"london"}  # never London: "always answer London" must stay a weak baseline
    while len(places) < n:
        name = rng.choice(_PLACE_STARTS) + rng.choice(_PLACE_MIDDLES) + rng.choice(_PLACE_ENDINGS)
        name = name.capitalize()
        if rng.random() < 0.1:
            name = rng.choice(_PLACE_PREFIXES) + name
        if name.lower() not in seen:
            seen.add(name.lower())
            places.append(name)
    return places


def _make_name(rng: random.Random) -> tuple[str, str]:
    # Mostly one syllable and an ending (short names leave room in the block for the facts), sometimes two.
    first = "".join(rng.choice(_FIRST_SYLLABLES) for _ in range(1 + (rng.random() < 0.3)))
    last = "".join(rng.choice(_LAST_SYLLABLES) for _ in range(1 + (rng.random() < 0.3)))
    first += rng.choice(_FIRST_ENDINGS)
    last += rng.choice(_LAST_ENDINGS)
    return first.capitalize(), last.capitalize()


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def make_world(n_people: int, seed: int = 0) -> World:
    """A deterministic synthetic world: the same (n_people, seed) gives the same world everywhere.

    Args:
        n_people: number of people (each gets one biography and one question), 2 to 200 000.
        seed: any integer.

    Raises:
        ConfigError: n_people out of range.
    """
    if isinstance(n_people, bool) or not isinstance(n_people, int) or not 2 <= n_people <= 200_000:
        raise ConfigError(f"n_people must be an integer from 2 to 200000, got {n_people!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    rng = random.Random(f"attnlab.world/{seed}")
    places = _make_places(rng, N_PLACES)
    place_words = {w.lower() for p in places for w in p.split()}
    cum_weights = list(accumulate(1.0 / (k + ZIPF_OFFSET) for k in range(N_PLACES)))

    def draw_place(avoid: str) -> str:
        while True:
            place = rng.choices(places, cum_weights=cum_weights)[0]
            if place != avoid:
                return place

    people: list[Person] = []
    names: set[str] = set()
    while len(people) < n_people:
        first, last = _make_name(rng)
        name = f"{first} {last}"
        if name in names or first.lower() in place_words or last.lower() in place_words:
            continue
        names.add(name)
        pronoun = rng.choice(("she", "he"))
        birth = rng.choices(places, cum_weights=cum_weights)[0]
        home, study = draw_place(birth), draw_place(birth)
        profession = rng.choice(PROFESSIONS)
        year = rng.randint(1820, 1999)
        a_prof = _article(profession)
        template = rng.randrange(len(TEMPLATES))
        biography = TEMPLATES[template].format(
            name=name,
            Pron=pronoun.capitalize(),
            pron=pronoun,
            poss="her" if pronoun == "she" else "his",
            a_prof=a_prof,
            a_Prof=a_prof.capitalize(),
            birth=birth,
            home=home,
            study=study,
            year=year,
        )
        people.append(Person(name, pronoun, birth, home, study, profession, year, biography, template))
    return World(people=tuple(people), places=tuple(places), seed=seed)
