"""Source ``toy_translation``: an offline synthetic translation task, generated in memory from a small grammar.

The source language ("Lingo", invented) and the target language (a fragment of English) share one meaning per
sentence; a model that translates well has to

- **reorder**: Lingo is verb-final (subject, adverbial phrase, object, verb) with postpositions, adjectives after
  the noun in mirrored order, subordinate clauses first and complement clauses before the main verb; English is
  SVO with prepositions and adjectives before the noun (``il kano la tabla sub dormet .`` = ``the dog sleeps
  under the table .``);
- **agree**: Lingo determiners and adjectives agree with the noun's gender and number (``lo kano grando`` /
  ``la gata granda`` / ``li kani grandi``), verbs with the subject's person and number (``-em -es -et -emos -etes
  -en``); English verbs agree with the subject (``sees`` / ``see``), negation takes *do*-support (``does not
  see``, ``did not see``), ``a`` becomes ``an`` before a vowel;
- **read the verb ending**: first and second person subjects are dropped in Lingo (``la gata videm .`` = ``i see
  the cat .``), so the English subject comes from the last word;
- **resolve ambiguity from context**: ``tom-`` is *drink* with a drink and *take* otherwise; the postposition
  ``an`` is *on* with a surface and *at* with a site; ``banko`` is *bench* with sit/sleep and *bank* with
  work/meet/go; the adjective ``klar-`` is *bright* (lights), *clear* (water, sky, windows) or *smart* (people);
  the relative pronoun is *who* for people and *that* otherwise, and Lingo's ``ki`` (subject) / ``kon`` (object)
  decides the English word order inside the relative clause; *because* / *although* clauses follow the main
  clause in English, *when* / *if* clauses precede it.

About 300 Lingo and 250 English word types; sentences of 4-30 words (a final ``.`` included). The grammar and
its lexicon are fixed; ``seed`` draws the sentences with its own ``random.Random`` (no global state touched).
The test split is drawn first, then valid, then train, each sentence (source or target) at most once over all
three, so the splits share no sentence and a larger ``train`` leaves valid and test unchanged. 20,000 pairs
take about a second.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from teachkit.data.raw import DATASETS, RawDataset, int_option
from teachkit.data.translation_files import (
    SplitLines,
    batching_options,
    encode_corpus,
    make_dataset,
    shared_vocabulary,
)
from teachkit.errors import ConfigError


# -- the lexicon ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Noun:
    """An English noun (singular, plural), its Lingo stem and gender (``m``: -o/-i, ``f``: -a/-e), and tags
    saying where it may occur (``person``, ``animal``, ``food``, ``drink``, ``thing``, ``text``, ``open``,
    ``place``, ``nature``; for postpositions ``surface``, ``site``, ``inside``; ``mass``: singular only; for
    ``klar-``: ``light``, ``clear``, ``person``). ``verbs``: only in adverbial phrases of these verbs."""

    en: str
    en_pl: str
    stem: str
    gender: str
    tags: frozenset[str]
    verbs: frozenset[str] | None = None

    def src(self, plural: bool) -> str:
        return self.stem + ("io"[not plural] if self.gender == "m" else "ea"[not plural])


def _nouns(spec: str) -> list[Noun]:
    out = []
    for row in spec.strip().splitlines():
        en, en_pl, stem, gender, tags, *verbs = row.split()
        out.append(Noun(en, en_pl, stem, gender, frozenset(tags.split(",")),
                        frozenset(verbs[0].split(",")) if verbs else None))
    return out


NOUNS: list[Noun] = _nouns("""
man men om m person
woman women fem f person
boy boys pur m person
girl girls pik f person
child children inf m person
teacher teachers magistr m person
doctor doctors medik f person
friend friends amik m person
king kings reg m person
queen queens regin f person
mother mothers matr f person
father fathers patr m person
sister sisters sor f person
brother brothers frat m person
farmer farmers agrikol m person
student students student f person
baker bakers panist m person
dog dogs kan m animal
cat cats gat f animal
bird birds uccel m animal
horse horses kaval m animal
cow cows vak f animal
fish fish pisk m animal
mouse mice sorik m animal
sheep sheep ov f animal
rabbit rabbits kunikl m animal
duck ducks anas f animal
apple apples pom f food
egg eggs uov m food
cake cakes tort f food
banana bananas banan f food
sandwich sandwiches panin m food
orange oranges oranj f food
cookie cookies biskot m food
water water akv f drink,clear,mass
milk milk lakt m drink,mass
tea tea te m drink,mass
coffee coffee kaf m drink,mass
juice juice suk m drink,mass
wine wine vin m drink,mass
book books libr m thing,text,open
letter letters leter f thing,text,open
newspaper newspapers jornal m thing,text,open
key keys klav f thing
ball balls bal f thing
cup cups tas f thing,inside
hat hats capel m thing
box boxes kest f thing,inside,open
picture pictures pintur f thing
car cars aut m thing,inside
phone phones fon m thing
bag bags sak m thing,inside,open
bottle bottles botel f thing,open
door doors pord f thing,open
window windows fenestr f thing,open,clear
lamp lamps lamp f thing,light
table tables tabl f thing,surface
chair chairs seg f thing,surface
bed beds let m thing,surface
floor floors planc m surface
roof roofs tekt m surface
tree trees arb m nature,surface
house houses dom f place,inside
room rooms kamer f place,inside,light
kitchen kitchens kuin f place,inside
garden gardens gard m place,inside
park parks park m place,inside
city cities urb f place,inside
school schools skol f place,site
station stations staci f place,site
market markets merkat m place,site
church churches eglis f place,site
river rivers riv m place,site,clear
lake lakes lag m place,site,clear
sun suns sol m nature,light
moon moons lun f nature,light
star stars stel f nature,light
sky skies cel m nature,clear
bench benches bank m surface sit,sleep
bank banks bank m site work,meet,go
""")


@dataclass(frozen=True)
class Verb:
    """An English verb (base, 3rd person singular, past), its Lingo stem, its kind (``trans``, ``intr``,
    ``motion``: adverbial phrases of direction, ``comp``: takes a ``that`` clause), the tags its subject may have
    and, when transitive, its object may have. ``alt``: the English forms used with an object tagged
    ``alt_tag`` (lexical ambiguity)."""

    name: str
    en: tuple[str, str, str]
    stem: str
    kind: str
    subj: frozenset[str]
    obj: frozenset[str] = frozenset()
    alt: tuple[str, str, str] | None = None
    alt_tag: str = ""

    def forms(self, obj: Noun | None) -> tuple[str, str, str]:
        return self.alt if self.alt and obj is not None and self.alt_tag in obj.tags else self.en


_ANIMATE = frozenset({"person", "animal"})
_PERSON = frozenset({"person"})


def _verbs(spec: str) -> list[Verb]:
    out = []
    for row in spec.strip().splitlines():
        name, forms, stem, kind, subj, *rest = row.split()
        alt, alt_tag = None, ""
        obj = frozenset(rest[0].split(",")) if rest else frozenset()
        if len(rest) > 1:
            alt_tag, alt_forms = rest[1].split(":")
            alt = tuple(alt_forms.split("/"))  # type: ignore[assignment]
        out.append(Verb(name, tuple(forms.split("/")), stem, kind,  # type: ignore[arg-type]
                        _ANIMATE if subj == "animate" else _PERSON, obj, alt, alt_tag))
    return out


VERBS: list[Verb] = _verbs("""
see see/sees/saw vid trans animate person,animal,thing,food,place,nature
like like/likes/liked am trans animate person,animal,thing,food,drink,place
find find/finds/found trov trans animate animal,thing,food
want want/wants/wanted vol trans animate thing,food,drink
eat eat/eats/ate manj trans animate food
take take/takes/took tom trans person thing,drink drink:drink/drinks/drank
buy buy/buys/bought kompr trans person thing,food,drink
carry carry/carries/carried port trans person thing,food,animal
help help/helps/helped ajut trans person person,animal
follow follow/follows/followed sekv trans animate person,animal
call call/calls/called vok trans person person,animal
watch watch/watches/watched rigard trans animate person,animal,nature
hold hold/holds/held ten trans person thing,animal
paint paint/paints/painted pikt trans person thing,place,nature,animal,person
read read/reads/read leg trans person text
write write/writes/wrote skrib trans person text
open open/opens/opened aper trans person open
meet meet/meets/met renkontr trans person person
cook cook/cooks/cooked kuir trans person food
clean clean/cleans/cleaned purig trans person thing,place
sleep sleep/sleeps/slept dorm intr animate
sit sit/sits/sat sed intr animate
wait wait/waits/waited atend intr animate
work work/works/worked labor intr person
play play/plays/played lud intr animate
sing sing/sings/sang kant intr person
go go/goes/went ir motion animate
run run/runs/ran kur motion animate
walk walk/walks/walked pas motion animate
come come/comes/came ven motion animate
say say/says/said dik comp person
think think/thinks/thought pens comp person
know know/knows/knew sci comp person
hope hope/hopes/hoped esper comp person
believe believe/believes/believed kred comp person
""")


@dataclass(frozen=True)
class Adjective:
    """An English adjective, its Lingo stem (-o/-a/-i/-e agreeing with the noun) and the noun tags it fits;
    ``senses`` maps a noun tag to another English word (``klar-``: bright / clear / smart)."""

    en: str
    stem: str
    fits: frozenset[str]
    senses: tuple[tuple[str, str], ...] = ()

    def word(self, noun: Noun) -> str:
        for tag, en in self.senses:
            if tag in noun.tags:
                return en
        return self.en

    def src(self, gender: str, plural: bool) -> str:
        return self.stem + ("io"[not plural] if gender == "m" else "ea"[not plural])


def _adjectives(spec: str) -> list[Adjective]:
    out = []
    for row in spec.strip().splitlines():
        en, stem, fits, *senses = row.split()
        out.append(Adjective(en, stem, frozenset(fits.split(",")),
                             tuple(tuple(s.split(":")) for s in senses)))  # type: ignore[misc]
    return out


ADJECTIVES: list[Adjective] = _adjectives("""
big grand person,animal,thing,place,food
small pikol person,animal,thing,place,food
old vekj person,animal,thing,place
young jun person,animal
red rub thing,food
blue blu thing
green verd thing,food
black negr animal,thing
white blank animal,thing
happy felic person,animal
sad trist person,animal
hungry fam person,animal
tired lac person,animal
new nov thing,place
beautiful bel person,animal,thing,place,nature
hot kald food,drink
cold frid food,drink
fresh fresk food,drink
sweet dolc food,drink
heavy pez thing
quiet kviet person,animal,place
smart klar light,clear,person light:bright clear:clear person:smart
""")

#: Lingo determiners: (English singular, English plural or None, Lingo forms m.sg, f.sg, m.pl, f.pl or None)
DETERMINERS: dict[str, tuple[str, str | None, tuple[str | None, ...]]] = {
    "def": ("the", "the", ("lo", "la", "li", "le")),
    "indef": ("a", "", ("un", "una", "", "")),
    "this": ("this", "these", ("esto", "esta", "esti", "este")),
    "that": ("that", "those", ("quelo", "quela", "queli", "quele")),
    "my": ("my", "my", ("mio", "mia", "miei", "mie")),
    "our": ("our", "our", ("nostro", "nostra", "nostri", "nostre")),
    "some": ("", "some", ("", "", "kelki", "kelke")),
    "many": ("", "many", ("", "", "multi", "multe")),
}
NUMERALS = {"two": "du", "three": "tri", "four": "kvar", "five": "kvin", "six": "ses"}
#: subject pronouns: (English, Lingo or "" when dropped, person-number 0..5 = 1sg 2sg 3sg 1pl 2pl 3pl)
PRONOUNS = (("i", "", 0), ("you", "", 1), ("he", "lu", 2), ("she", "lei", 2), ("we", "", 3), ("you", "", 4),
            ("they", "loro", 5))
VERB_ENDINGS = ("em", "es", "et", "emos", "etes", "en")
#: postpositions: Lingo -> ((noun tag, English), ...) in order of preference; motion: for motion verbs
POSTPOSITIONS: dict[str, tuple[tuple[tuple[str, str], ...], bool]] = {
    "an": ((("surface", "on"), ("site", "at")), False),
    "sub": ((("surface", "under"),), False),
    "en": ((("inside", "in"),), False),
    "apud": ((("surface", "near"), ("site", "near"), ("inside", "near")), False),
    "kun": ((("person", "with"), ("animal", "with")), False),
    "al": ((("site", "to"), ("inside", "to")), True),
    "de": ((("site", "from"), ("inside", "from")), True),
}
TENSES = {"present": "", "past": "ja", "future": "va"}
#: time adverbs: Lingo (sentence-initial) -> (English (sentence-final), tenses it allows)
ADVERBS = {"hieri": ("yesterday", ("past",)), "morgau": ("tomorrow", ("future",)), "nun": ("now", ("present",)),
           "ofte": ("often", ("present", "past")), "hodiau": ("today", ("present", "past", "future"))}
#: adverbial clauses: Lingo conjunction -> (English, the English clause comes first)
CONJUNCTIONS = {"kar": ("because", False), "kvankam": ("although", False), "kiam": ("when", True),
                "se": ("if", True)}
MIN_WORDS, MAX_WORDS = 4, 30


def lexicon_words() -> tuple[set[str], set[str]]:
    """Every Lingo and every English word form the grammar can produce (for tests and the docs)."""
    src: set[str] = {".", ",", "ne", "ke", "ki", "kon", *TENSES.values(), *NUMERALS.values(), *ADVERBS,
                     *CONJUNCTIONS, *POSTPOSITIONS}
    en: set[str] = {".", ",", "not", "do", "does", "did", "will", "that", "who", "an", *NUMERALS,
                    *(a for a, _ in ADVERBS.values()), *(c for c, _ in CONJUNCTIONS.values()),
                    *(e for senses, _ in POSTPOSITIONS.values() for _, e in senses)}
    for n in NOUNS:
        src.update((n.src(False), n.src(True)))
        en.update((n.en, n.en_pl))
    for v in VERBS:
        src.update(v.stem + e for e in VERB_ENDINGS)
        en.update(v.en)
        en.update(v.alt or ())
    for a in ADJECTIVES:
        src.update(a.src(g, p) for g in "mf" for p in (False, True))
        en.update(a.word(n) for n in NOUNS if a.fits & n.tags)
    for sg, pl, forms in DETERMINERS.values():
        src.update(f for f in forms if f)
        en.update(w for w in (sg, pl) if w)
    for e, s, _ in PRONOUNS:
        en.add(e)
        if s:
            src.add(s)
    src.discard("")
    return src, en


# -- generation ---------------------------------------------------------------------------------------------------
_BY_TAG: dict[frozenset[str], list[Noun]] = {}


def _nouns_with(tags: frozenset[str], verb: str | None = None) -> list[Noun]:
    """Nouns carrying one of ``tags`` (verb-restricted nouns only when ``verb`` allows them)."""
    key = frozenset((*tags, f"verb:{verb}"))
    if key not in _BY_TAG:
        _BY_TAG[key] = [n for n in NOUNS if n.tags & tags and (n.verbs is None or verb in n.verbs)]
    return _BY_TAG[key]


class Generator:
    """Sentence pairs drawn with ``rng`` (see the module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def noun_phrase(self, noun: Noun, depth: int, allow_rel: bool = True) -> tuple[list[str], list[str], int]:
        """(Lingo words, English words, person-number: 2 singular, 5 plural) of a phrase headed by ``noun``."""
        r = self.rng
        plural = "mass" not in noun.tags and r.random() < 0.35
        g = 0 if noun.gender == "m" else 1
        slot = g + 2 * plural
        if plural:
            kind = r.choice(("def", "def", "indef", "this", "that", "my", "our", "some", "many", "num", "num"))
        else:
            kind = r.choice(("def", "def", "def", "indef", "indef", "this", "that", "my", "our"))
            if "mass" in noun.tags and kind == "indef":
                kind = "def"
        adjs: list[Adjective] = []
        fitting = [a for a in ADJECTIVES if a.fits & noun.tags]
        if fitting and r.random() < 0.4:
            adjs.append(r.choice(fitting))
            if r.random() < 0.2:
                other = r.choice(fitting)
                if other is not adjs[0]:
                    adjs.append(other)
        src: list[str] = []
        en: list[str] = []
        if kind == "num":
            word = r.choice(tuple(NUMERALS))
            src.append(NUMERALS[word])
            en.append(word)
        else:
            sg, pl, forms = DETERMINERS[kind]
            if forms[slot]:
                src.append(forms[slot])  # type: ignore[arg-type]
            det = pl if plural else sg
            if det:
                en.append(det)
        src.append(noun.src(plural))
        src.extend(a.src(noun.gender, plural) for a in reversed(adjs))  # Lingo mirrors the adjective order
        en.extend(a.word(noun) for a in adjs)
        en.append(noun.en_pl if plural else noun.en)
        if en[0] == "a" and en[1][0] in "aeio":
            en[0] = "an"
        if allow_rel and depth < 2 and ("person" in noun.tags or "animal" in noun.tags or "thing" in noun.tags) \
                and r.random() < 0.12:
            rs, re_ = self.relative(noun, 5 if plural else 2, depth + 1)
            src.extend(rs)
            en.extend(re_)
        return src, en, 5 if plural else 2

    def relative(self, head: Noun, head_pn: int, depth: int) -> tuple[list[str], list[str]]:
        """A relative clause on ``head``: ``ki`` (the head is its subject) or ``kon`` (its object); verb-final
        in Lingo, ``who`` / ``that`` + English order."""
        r = self.rng
        pronoun = "who" if "person" in head.tags else "that"
        tense = r.choice(("present", "present", "past"))
        as_subject = [v for v in VERBS if v.kind in ("trans", "intr") and v.subj & head.tags]
        as_object = [v for v in VERBS if v.kind == "trans" and v.obj & head.tags]
        if as_subject and (not as_object or r.random() < 0.5):
            verb = r.choice(as_subject)
            src, en = ["ki"], [pronoun]
            obj_noun = None
            obj_src: list[str] = []
            obj_en: list[str] = []
            if verb.kind == "trans":
                obj_noun = r.choice(_nouns_with(verb.obj))
                obj_src, obj_en, _ = self.noun_phrase(obj_noun, depth, allow_rel=False)
            vs, ve = self.verb_group(verb, head_pn, tense, False, obj_noun)
            return src + obj_src + vs, en + ve + obj_en
        verb = r.choice(as_object)
        subj_src, subj_en, pn = self.subject(verb, depth, allow_rel=False)
        vs, ve = self.verb_group(verb, pn, tense, False, head)
        return ["kon", *subj_src, *vs], [pronoun, *subj_en, *ve]

    def subject(self, verb: Verb, depth: int, allow_rel: bool = True) -> tuple[list[str], list[str], int]:
        r = self.rng
        if r.random() < 0.3:
            en, src, pn = r.choice(PRONOUNS)
            return ([src] if src else []), [en], pn
        return self.noun_phrase(r.choice(_nouns_with(verb.subj)), depth, allow_rel)

    def verb_group(self, verb: Verb, pn: int, tense: str, negated: bool, obj: Noun | None) -> tuple[list[str],
                                                                                                    list[str]]:
        """Lingo ``[ne] [ja|va] stem+ending``; English with agreement, *do*-support and *will*."""
        base, third, past = verb.forms(obj)
        src = (["ne"] if negated else []) + ([TENSES[tense]] if TENSES[tense] else []) + [verb.stem + VERB_ENDINGS[pn]]
        if tense == "future":
            en = ["will", "not", base] if negated else ["will", base]
        elif tense == "past":
            en = ["did", "not", base] if negated else [past]
        elif negated:
            en = ["does" if pn == 2 else "do", "not", base]
        else:
            en = [third if pn == 2 else base]
        return src, en

    def adverbial(self, verb: Verb) -> tuple[list[str], list[str]] | None:
        """A postpositional phrase fitting ``verb`` (Lingo ``NP post``, English ``prep NP``), or None."""
        r = self.rng
        motion = verb.kind == "motion"
        posts = [p for p, (_, m) in POSTPOSITIONS.items() if m == motion]
        post = r.choice(posts)
        senses = POSTPOSITIONS[post][0]
        nouns = _nouns_with(frozenset(t for t, _ in senses), verb.name)
        if not nouns:
            return None
        noun = r.choice(nouns)
        prep = next(e for t, e in senses if t in noun.tags)
        src, en, _ = self.noun_phrase(noun, 2, allow_rel=False)
        return [*src, post], [prep, *en]

    def clause(self, depth: int, tense: str | None = None) -> tuple[list[str], list[str]]:
        """Lingo: subject, adverbial phrase, object / complement clause, verb group. English: subject, verb group,
        object or ``that`` clause, adverbial phrase."""
        r = self.rng
        kinds = ["trans"] * 6 + ["intr"] * 2 + ["motion"] * 2 + (["comp"] * 2 if depth == 0 else [])
        kind = r.choice(kinds)
        verb = r.choice([v for v in VERBS if v.kind == kind])
        tense = tense or r.choice(("present", "present", "past", "future"))
        negated = r.random() < 0.15
        subj_src, subj_en, pn = self.subject(verb, depth)
        src, en = list(subj_src), list(subj_en)
        if verb.kind == "comp":
            sub_src, sub_en = self.clause(depth + 1)
            vs, ve = self.verb_group(verb, pn, tense, negated, None)
            return src + ["ke", *sub_src, *vs], en + ve + ["that", *sub_en]
        pp = self.adverbial(verb) if (verb.kind != "trans" and r.random() < 0.7) or r.random() < 0.25 else None
        obj_noun = None
        obj_src: list[str] = []
        obj_en: list[str] = []
        if verb.kind == "trans":
            obj_noun = r.choice(_nouns_with(verb.obj))
            obj_src, obj_en, _ = self.noun_phrase(obj_noun, depth)
        vs, ve = self.verb_group(verb, pn, tense, negated, obj_noun)
        if pp is not None:
            src.extend(pp[0])
        src.extend(obj_src)
        src.extend(vs)
        en.extend(ve)
        en.extend(obj_en)
        if pp is not None:
            en.extend(pp[1])
        return src, en

    def sentence(self) -> tuple[str, str]:
        r = self.rng
        u = r.random()
        if u < 0.15:  # an adverbial clause: first in Lingo; in English first or last by the conjunction
            conj = r.choice(tuple(CONJUNCTIONS))
            word, first = CONJUNCTIONS[conj]
            sub_tense = "present" if conj == "se" else None
            sub_src, sub_en = self.clause(1, sub_tense)
            main_src, main_en = self.clause(1, r.choice(("present", "future")) if conj == "se" else None)
            src = [conj, *sub_src, ",", *main_src]
            en = [word, *sub_en, ",", *main_en] if first else [*main_en, word, *sub_en]
        elif u < 0.35:  # a time adverb: first in Lingo, last in English; the tense follows it
            adverb = r.choice(tuple(ADVERBS))
            word, tenses = ADVERBS[adverb]
            main_src, main_en = self.clause(0, r.choice(tenses))
            src, en = [adverb, *main_src], [*main_en, word]
        else:
            src, en = self.clause(0)
        return " ".join([*src, "."]), " ".join([*en, "."])


def generate(counts: dict[str, int], seed: int) -> dict[str, tuple[list[str], list[str]]]:
    """Sentence pairs per split, drawn in the order of ``counts`` (test, valid, train), none repeated (neither
    its source nor its target) within or across splits, each side 4-30 words."""
    gen = Generator(random.Random(seed))
    seen_src: set[str] = set()
    seen_tgt: set[str] = set()
    out: dict[str, tuple[list[str], list[str]]] = {}
    for name, n in counts.items():
        src: list[str] = []
        tgt: list[str] = []
        tries = 0
        while len(src) < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise ConfigError(f"dataset 'toy_translation' cannot draw {n:,} distinct {name} sentences; ask for "
                                  "fewer")
            s, t = gen.sentence()
            if s in seen_src or t in seen_tgt or not (MIN_WORDS <= s.count(" ") + 1 <= MAX_WORDS) or \
                    not (MIN_WORDS <= t.count(" ") + 1 <= MAX_WORDS):
                continue
            seen_src.add(s)
            seen_tgt.add(t)
            src.append(s)
            tgt.append(t)
        out[name] = (src, tgt)
    return out


@DATASETS.register("toy_translation", "synthetic Lingo->English translation (reordering, agreement, ambiguity "
                                      "resolved by context); 20k/1k/1k pairs generated offline")
def toy_translation(root: str | None = None, train: int = 20000, valid: int = 1000, test: int = 1000, seed: int = 0,
                    bpe_size: int = 0, vocab_file: str | None = None, max_tokens: int | None = None,
                    decode: str = "greedy", beam: int = 5, length_penalty: float = 1.0, max_len_a: float = 1.2,
                    max_len_b: int = 10) -> RawDataset:
    """The synthetic translation task of the module docstring: ``train`` / ``valid`` / ``test`` pairs drawn with
    ``seed``; word units (``bpe_size=0``) or a joint BPE of ``bpe_size`` merges learned on train; the vocabulary
    from train only, or that of an earlier run (``vocab_file``: its ``vocab.json`` or folder, with the
    ``bpe.json`` beside it when it learned BPE). Batching and decoding options as for ``parallel_text``."""
    name = "toy_translation"
    counts = {"test": int_option(name, "test", test, 1), "val": int_option(name, "valid", valid, 1),
              "train": int_option(name, "train", train, 1)}
    seed = int_option(name, "seed", seed, 0)
    bpe_size = int_option(name, "bpe_size", bpe_size, 0)
    max_tokens, decode_options = batching_options(name, max_tokens, decode, beam, length_penalty, max_len_a,
                                                  max_len_b)
    pairs = generate(counts, seed)
    splits = {part: SplitLines(src, tgt, list(range(1, len(src) + 1)), f"{part} (lingo)", f"{part} (english)")
              for part, (src, tgt) in pairs.items()}
    if vocab_file is not None:
        if not isinstance(vocab_file, str) or not vocab_file:
            raise ConfigError(f"dataset {name!r} option 'vocab_file' must be a path to a vocab.json or the folder of "
                              f"the run that wrote it, got {vocab_file!r}")
        vocab, bpe, where = shared_vocabulary(name, vocab_file)
        enc = encode_corpus(name, splits, units="learn" if bpe is not None else "none", bpe=bpe, vocab=vocab,
                            max_length=1024, sources={"vocab": where, "bpe": where})
    else:
        enc = encode_corpus(name, splits, units="learn" if bpe_size else "none", bpe_size=bpe_size,
                            max_length=1024)
    enc.notes.update({"generator": f"toy_translation grammar, seed {seed}", "skipped_empty": {},
                      "val": "generated (test drawn first, then valid, then train; no sentence shared)"})
    return make_dataset(name, enc, "lingo", "en", decode_options, max_tokens)


def describe(options: dict[str, Any] | None = None) -> str:
    """A few generated pairs, for the docs and a quick look (``python -m teachkit.data.toy_translation``)."""
    pairs = generate({"test": 8}, int((options or {}).get("seed", 0)))["test"]
    return "\n".join(f"{s}\n  -> {t}" for s, t in zip(*pairs, strict=True))


if __name__ == "__main__":
    print(describe())
