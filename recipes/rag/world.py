"""The invented mini-world of the RAG recipe's questions: countries, cities, people, works and
companies generated from a seed, one paragraph per entity, two-hop questions over them in
MuSiQue's layout, and a handful of handwritten questions with their own paragraphs.

The world is consistent: every fact a question needs is stated in exactly one paragraph, and a
person's paragraph names their city but never its country, so the questions need both hops.
`data.py` writes `build_dataset()` to `data/questions.jsonl` and `data/corpus.jsonl`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import Any

DISTRACTORS = 4  # non-supporting paragraphs in each row's `paragraphs` (MuSiQue has 18)

_ONSETS = ("br", "k", "v", "t", "m", "s", "d", "l", "r", "g", "n", "p", "th", "z", "h", "f")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("n", "r", "l", "s", "th", "k", "m", "nd", "st", "")
_COUNTRY_ENDINGS = ("ia", "land", "ova", "aria", "esh")
_CITY_ENDINGS = ("ford", "mouth", "vik", "burg", "ton", "holm", "ick")
_KINDS_OF_TOWN = ("a river town", "a port city", "a hill town", "a market town", "a mining town")
_PROFESSIONS = ("painter", "composer", "engineer", "poet", "architect", "botanist")
_WORKS = {
    "painter": "painting",
    "composer": "opera",
    "engineer": "treatise",
    "poet": "poem cycle",
    "architect": "design manual",
    "botanist": "field guide",
}
_WORK_NOUNS = ("Orchard", "Lantern", "Harbour", "Winter", "Mirror", "Garden", "Bridge", "Tide", "Crown", "Meadow")
_WORK_ADJECTIVES = ("Salt", "Silver", "Quiet", "Red", "Last", "Hollow", "Northern", "Paper", "Golden", "Broken")
_COMPANY_KINDS = ("Mills", "Works", "Shipping", "Instruments", "Glassworks", "Press")


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables - 1)) + (
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
    )


class _Names:
    """Unique invented names (an entity name is never a prefix of another's words)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set[str]()

    def make(self, build: Any) -> str:
        while True:
            name = build(self.rng)
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name


def make_world(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Countries, cities, people, works and companies, each with its facts, from `seed`."""
    rng = random.Random(f"rag-world:{seed}")
    names = _Names(rng)
    countries = [
        {"name": names.make(lambda r: (_word(r, 1) + r.choice(_COUNTRY_ENDINGS)).capitalize())} for _ in range(8)
    ]
    for country in countries:
        country["alias"] = f"Republic of {country['name']}"
    cities = [
        {
            "name": names.make(lambda r: (_word(r, 1) + r.choice(_CITY_ENDINGS)).capitalize()),
            "country": rng.choice(countries)["name"],
            "kind": rng.choice(_KINDS_OF_TOWN),
            "founded": rng.randint(900, 1700),
        }
        for _ in range(30)
    ]
    people = [
        {
            "name": names.make(lambda r: f"{_word(r, 2).capitalize()} {_word(r, 1).capitalize()}"),
            "born": rng.randint(1780, 1960),
            "city": rng.choice(cities)["name"],
            "profession": rng.choice(_PROFESSIONS),
        }
        for _ in range(50)
    ]
    works = []
    for person in rng.sample(people, 40):
        title = names.make(lambda r: f"The {r.choice(_WORK_ADJECTIVES)} {r.choice(_WORK_NOUNS)}")
        works.append(
            {"name": title, "kind": _WORKS[person["profession"]], "by": person["name"], "year": person["born"] + 30}
        )
    companies = [
        {
            "name": names.make(lambda r: f"{_word(r, 2).capitalize()} {r.choice(_COMPANY_KINDS)}"),
            "founder": founder["name"],
            "city": rng.choice(cities)["name"],
        }
        for founder in rng.sample(people, 20)
    ]
    return {"countries": countries, "cities": cities, "people": people, "works": works, "companies": companies}


def world_paragraphs(world: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    """One paragraph per entity, by title. A person's paragraph names their city, never its country
    (so a two-hop question needs both paragraphs)."""
    paragraphs = {}
    for country in world["countries"]:
        paragraphs[country["name"]] = (
            f"{country['name']}, officially the {country['alias']}, is a small country with its own language."
        )
    for city in world["cities"]:
        paragraphs[city["name"]] = (
            f"{city['name']} is {city['kind']} in {city['country']}, founded in {city['founded']}."
        )
    for person in world["people"]:
        paragraphs[person["name"]] = (
            f"{person['name']} (born {person['born']}) was a {person['profession']} born in {person['city']}."
        )
    for work in world["works"]:
        paragraphs[work["name"]] = f"{work['name']} is a {work['kind']} by {work['by']}, finished in {work['year']}."
    for company in world["companies"]:
        paragraphs[company["name"]] = (
            f"{company['name']} is a company founded by {company['founder']}, based in {company['city']}."
        )
    return paragraphs


def _hop_questions(world: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """(question, answer, aliases, [(hop question, hop answer, title)] x2) for each template."""
    by_name = {e["name"]: e for group in world.values() for e in group}
    out = []
    for person in world["people"]:
        city = by_name[person["city"]]
        country = by_name[city["country"]]
        out.append(
            (
                f"In which country was {person['name']} born?",
                country["name"],
                [country["alias"]],
                [
                    (f"Where was {person['name']} born?", city["name"], person["name"]),
                    ("In which country is #1?", country["name"], city["name"]),
                ],
            )
        )
    for work in world["works"]:
        person = by_name[work["by"]]
        out.append(
            (
                f"In which city was the creator of {work['name']} born?",
                person["city"],
                [],
                [
                    (f"Who made {work['name']}?", person["name"], work["name"]),
                    ("Where was #1 born?", person["city"], person["name"]),
                ],
            )
        )
        out.append(
            (
                f"In what year was the creator of {work['name']} born?",
                str(person["born"]),
                [],
                [
                    (f"Who made {work['name']}?", person["name"], work["name"]),
                    ("When was #1 born?", str(person["born"]), person["name"]),
                ],
            )
        )
    for company in world["companies"]:
        city = by_name[company["city"]]
        founder = by_name[company["founder"]]
        out.append(
            (
                f"In which country is {company['name']} based?",
                city["country"],
                [by_name[city["country"]]["alias"]],
                [
                    (f"Where is {company['name']} based?", city["name"], company["name"]),
                    ("In which country is #1?", city["country"], city["name"]),
                ],
            )
        )
        out.append(
            (
                f"What was the profession of the founder of {company['name']}?",
                founder["profession"],
                [],
                [
                    (f"Who founded {company['name']}?", founder["name"], company["name"]),
                    ("What was the profession of #1?", founder["profession"], founder["name"]),
                ],
            )
        )
    return out


# Handwritten questions: their own small facts, paragraphs and decomposition (hop question, answer, title).
HANDWRITTEN: list[dict[str, Any]] = [
    {
        "question": "Which river flows past the lighthouse where Ama Colt worked?",
        "answer": "Oster",
        "answer_aliases": ["River Oster", "the Oster"],
        "paragraphs": {
            "Ama Colt": "Ama Colt was the keeper of the Grey Point lighthouse for thirty years.",
            "Grey Point lighthouse": "The Grey Point lighthouse stands where the river Oster meets the sea.",
        },
        "hops": [
            ("Where did Ama Colt work?", "Grey Point lighthouse", "Ama Colt"),
            ("Which river flows past #1?", "Oster", "Grey Point lighthouse"),
        ],
    },
    {
        "question": "What instrument did the teacher of Pell Marrow play?",
        "answer": "cello",
        "answer_aliases": ["violoncello"],
        "paragraphs": {
            "Pell Marrow": "Pell Marrow studied composition under Ines Dorrance at the Quay School.",
            "Ines Dorrance": "Ines Dorrance was a cello player who taught at the Quay School.",
        },
        "hops": [
            ("Who taught Pell Marrow?", "Ines Dorrance", "Pell Marrow"),
            ("What instrument did #1 play?", "cello", "Ines Dorrance"),
        ],
    },
    {
        "question": "In what year did the ship that rescued Tobin Reyes sink?",
        "answer": "1911",
        "answer_aliases": [],
        "paragraphs": {
            "Tobin Reyes": "Tobin Reyes was a sailor rescued at sea by the crew of the Marigold Star.",
            "Marigold Star": "The Marigold Star was a cargo ship that sank off the Wend coast in 1911.",
        },
        "hops": [
            ("Which ship rescued Tobin Reyes?", "Marigold Star", "Tobin Reyes"),
            ("When did #1 sink?", "1911", "Marigold Star"),
        ],
    },
    {
        "question": "Who designed the bridge on which the Kettle Fair is held?",
        "answer": "Hale Oduya",
        "answer_aliases": ["H. Oduya"],
        "paragraphs": {
            "Kettle Fair": "The Kettle Fair is held every spring on the Ninefold Bridge.",
            "Ninefold Bridge": "The Ninefold Bridge is a stone bridge designed by Hale Oduya.",
        },
        "hops": [
            ("Where is the Kettle Fair held?", "Ninefold Bridge", "Kettle Fair"),
            ("Who designed #1?", "Hale Oduya", "Ninefold Bridge"),
        ],
    },
    {
        "question": "What colour is the flag of the island where Sefa Lind was born?",
        "answer": "green",
        "answer_aliases": [],
        "paragraphs": {
            "Sefa Lind": "Sefa Lind was a glassmaker born on the island of Corrow.",
            "Corrow": "Corrow is an island whose flag is plain green.",
        },
        "hops": [
            ("Where was Sefa Lind born?", "Corrow", "Sefa Lind"),
            ("What colour is the flag of #1?", "green", "Corrow"),
        ],
    },
    {
        "question": "Which language is spoken in the valley where the Osk cheese is made?",
        "answer": "Tallic",
        "answer_aliases": ["the Tallic language"],
        "paragraphs": {
            "Osk cheese": "Osk cheese is a hard cheese made only in the Brandle valley.",
            "Brandle valley": "In the Brandle valley most people speak Tallic.",
        },
        "hops": [
            ("Where is Osk cheese made?", "Brandle valley", "Osk cheese"),
            ("Which language is spoken in #1?", "Tallic", "Brandle valley"),
        ],
    },
    {
        "question": "How many towers does the castle that Queen Ysolde built have?",
        "answer": "seven",
        "answer_aliases": ["7"],
        "paragraphs": {
            "Queen Ysolde": "Queen Ysolde built Harrowmere Castle in her tenth year on the throne.",
            "Harrowmere Castle": "Harrowmere Castle has seven towers and a moat.",
        },
        "hops": [
            ("Which castle did Queen Ysolde build?", "Harrowmere Castle", "Queen Ysolde"),
            ("How many towers does #1 have?", "seven", "Harrowmere Castle"),
        ],
    },
    {
        "question": "Who coached the team that won the first Lowmarch Cup?",
        "answer": "Dara Quill",
        "answer_aliases": [],
        "paragraphs": {
            "Lowmarch Cup": "The first Lowmarch Cup was won by the Fenby Rovers.",
            "Fenby Rovers": "The Fenby Rovers were a football team coached by Dara Quill.",
        },
        "hops": [
            ("Who won the first Lowmarch Cup?", "Fenby Rovers", "Lowmarch Cup"),
            ("Who coached #1?", "Dara Quill", "Fenby Rovers"),
        ],
    },
]


def build_dataset(seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The questions (MuSiQue rows) and the corpus ({id, title, text}) of the world of `seed` plus
    the handwritten questions."""
    world = make_world(seed)
    paragraphs = world_paragraphs(world)
    for item in HANDWRITTEN:
        paragraphs.update(item["paragraphs"])
    corpus = [{"id": f"p{i:04d}", "title": title, "text": text} for i, (title, text) in enumerate(paragraphs.items())]
    rng = random.Random(f"rag-distractors:{seed}")
    titles = list(paragraphs)
    questions = []
    items = [(q, a, aliases, hops) for q, a, aliases, hops in _hop_questions(world)]
    items += [(h["question"], h["answer"], h["answer_aliases"], h["hops"]) for h in HANDWRITTEN]
    for question, answer, aliases, hops in items:
        supporting = [title for _, _, title in hops]
        chosen = supporting + rng.sample([t for t in titles if t not in supporting], DISTRACTORS)
        rng.shuffle(chosen)
        row_id = f"2hop__alight_{hashlib.sha256(question.encode()).hexdigest()[:10]}"
        questions.append(
            {
                "id": row_id,
                "question": question,
                "answer": answer,
                "answer_aliases": list(aliases),
                "paragraphs": [
                    {
                        "idx": i,
                        "title": title,
                        "paragraph_text": paragraphs[title],
                        "is_supporting": title in supporting,
                    }
                    for i, title in enumerate(chosen)
                ],
                "question_decomposition": [
                    {"id": n, "question": hop_q, "answer": hop_a, "paragraph_support_idx": chosen.index(title)}
                    for n, (hop_q, hop_a, title) in enumerate(hops)
                ],
                "answerable": True,
            }
        )
    return questions, corpus
