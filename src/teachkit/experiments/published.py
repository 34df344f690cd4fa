"""Published figures the report compares with, transcribed from ``docs/reference_results.md``.

Every value here is a number that page states, with the paper and table it names; none is a teachkit
measurement, and nothing is filled in where the page leaves a cell empty. Names are teachkit's: datasets
(``cifar100``), models (``resnet110``, ``wrn_40_2``, ``resnet50_cifar`` for RepDistiller's CIFAR ResNet-50)
and methods (``kd.method`` names such as ``kd``, ``crd``, ``dkd``; recipe names ``train`` = no KD / from
scratch, ``takd``, ``rco``, ``annealing``, ``prokd``). Models teachkit has no name for (the GLUE/SQuAD BERT
family, ImageNet ResNets trained elsewhere) keep the paper's name. MLKD is teachkit's method ``mlkd``. Logit
standardisation (Sun et al. 2024) is not a method but the ``logit_standardize`` option of ``kd``, ``dkd`` and
``mlkd``, so its rows keep the page's spelling ``<method>+ls`` (``kd+ls``, ``dkd+ls``, ``mlkd+ls``); so do the
DOT rows (``kd+dot``), DOT being an optimiser, not a method. A ``train`` entry is a model trained on labels
alone: ``teacher`` is None and ``student`` is the model (a teacher's own accuracy too).

Not transcribed: the ECCV 2024 (Hamidi et al.) MSE-teacher numbers (the page gives only the CE-teacher
baselines and the run-to-run variances of that grid), RCO's GLUE dev score (Table 4 prints an inconsistent
figure), L2T-DLF accuracies (the page gives none), the IWSLT14 BLEU range and independent re-runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    """One published figure: where it is from, what it measures, under which protocol."""

    paper: str
    table: str
    dataset: str
    teacher: str | None  #: the teacher model; None for a model trained on labels alone (method ``train``)
    student: str
    method: str
    teacher_loss: str | None  #: the teacher's training loss ("ce"); None without a teacher
    metric: str
    value: float
    protocol: str
    source: str


_PROKD = "Rezagholizadeh et al. 2022, Pro-KD: Progressive Distillation by Following the Footsteps of the Teacher"
_PROKD_PROTOCOL = "test accuracy as printed in the paper (selection rule and number of runs not stated there)"
_PROKD_TEXT = "GLUE score as printed in the paper (selection rule and number of runs not stated there)"
_SQUAD_PROTOCOL = "as printed in the paper; the tables do not name the metric (EM or F1)"
_CRD = "Tian, Krishnan & Isola 2020, Contrastive Representation Distillation (ICLR)"
_CRD_SOURCE = "CRD Tables 1-2, reproduced in the README of HobbitLong/RepDistiller"
_DKD = "Zhao et al. 2022, Decoupled Knowledge Distillation (CVPR)"
_DKD_SOURCE = "README of megvii-research/mdistiller (the authors' repository)"
_REVIEWKD = "Chen et al. 2021, Distilling Knowledge via Knowledge Review (CVPR)"
_MAX_TEST = ("maximum test accuracy over epochs (the reference scripts, e.g. RepDistiller's train_student.py, "
             "evaluate the test set every epoch and keep the best); number of runs averaged not stated")


def _prokd_cifar() -> list[Published]:
    """Pro-KD Tables 2 (CIFAR-10) and 3 (CIFAR-100): ResNet-110 teacher -> ResNet-8 student, TA ResNet-20."""
    rows = [("train", "resnet8", 88.44, 61.37), ("kd", "resnet8", 88.45, 61.41), ("takd", "resnet8", 88.47, 61.82),
            ("rco", "resnet8", 88.90, 61.62), ("annealing", "resnet8", 89.44, 63.1),
            ("prokd", "resnet8", 90.01, 63.43)]
    out = []
    for method, student, c10, c100 in rows:
        for dataset, table, value in (("cifar10", "Table 2", c10), ("cifar100", "Table 3", c100)):
            teacher = None if method == "train" else "resnet110"
            out.append(Published(_PROKD, table, dataset, teacher, student, method, None if teacher is None else "ce",
                                 "acc", value, _PROKD_PROTOCOL, f"{_PROKD}, {table}"))
    return out


def _prokd_cifar_teacher_and_assistant() -> list[Published]:
    """The teacher ResNet-110 and the TA ResNet-20 (KD from the ResNet-110) rows of Pro-KD Tables 2-3."""
    out = []
    for dataset, table, teacher_acc, ta_acc in (("cifar10", "Table 2", 93.8, 92.39),
                                                 ("cifar100", "Table 3", 71.92, 67.6)):
        out.append(Published(_PROKD, table, dataset, None, "resnet110", "train", None, "acc", teacher_acc,
                             _PROKD_PROTOCOL, f"{_PROKD}, {table} (teacher)"))
        out.append(Published(_PROKD, table, dataset, "resnet110", "resnet20", "kd", "ce", "acc", ta_acc,
                             _PROKD_PROTOCOL, f"{_PROKD}, {table} (teacher assistant)"))
    return out


def _prokd_text() -> list[Published]:
    """Pro-KD Tables 4-9 (GLUE, SQuAD) and Table 10 (no temperature)."""
    methods = ("train", "kd", "takd", "rco", "annealing", "prokd")
    glue = [("roberta-large", "distilroberta", "Table 4", "glue_dev", (83.32, 83.85, 83.93, None, 84.52, 84.62)),
            ("roberta-large", "distilroberta", "Table 5", "glue_test", (None, 80.62, 80.69, 80.51, 81.23, 81.56)),
            ("bert-large", "bert-small", "Table 6", "glue_dev", (77.74, 77.67, 77.84, 77.73, 78.33, 78.72)),
            ("bert-large", "bert-small", "Table 7", "glue_test", (74.37, 73.95, 74.06, 74.23, 74.83, 75.16))]
    out = []
    for teacher, student, table, metric, values in glue:
        for method, value in zip(methods, values, strict=True):
            if value is not None:
                out.append(Published(_PROKD, table, "glue", None if method == "train" else teacher, student, method,
                                     None if method == "train" else "ce", metric, value, _PROKD_TEXT,
                                     f"{_PROKD}, {table}"))
    squad = [("roberta-large", "distilroberta", "Table 8", (93.7, 87.0), {"kd": (85.0, 73.65), "takd": (85.4, 73.8),
                                                                          "prokd": (86.0, 76.0)}),
             ("bert-large", "bert-small", "Table 9", (90.2, 81.0), {"kd": (78.54, 61.66), "takd": (78.5, 61.66),
                                                                    "prokd": (79.7, 62.76)})]
    for teacher, student, table, teacher_values, students in squad:
        for version, index in (("squad1.1", 0), ("squad2.0", 1)):
            out.append(Published(_PROKD, table, "squad", None, teacher, "train", None, version,
                                 teacher_values[index], _SQUAD_PROTOCOL, f"{_PROKD}, {table} (teacher)"))
            for method, values in students.items():
                out.append(Published(_PROKD, table, "squad", teacher, student, method, "ce", version, values[index],
                                     _SQUAD_PROTOCOL, f"{_PROKD}, {table}"))
    for method, value in (("prokd", 81.63), ("prokd-no-temperature", 80.61)):
        out.append(Published(_PROKD, "Table 10", "glue", "roberta-large", "distilroberta", method, "ce",
                             "glue_dev_with_wnli", value, "GLUE dev average including WNLI, as printed in the paper",
                             f"{_PROKD}, Table 10"))
    return out


#: (teacher, student, teacher acc, student acc, KD, CRD, DKD, ReviewKD): the CIFAR-100 CE-teacher grid
_CIFAR100_GRID: tuple[tuple[str, str, float, float, float, float, float | None, float | None], ...] = (
    ("resnet56", "resnet20", 72.34, 69.06, 70.66, 71.16, 71.97, 71.89),
    ("resnet110", "resnet20", 74.31, 69.06, 70.67, 71.46, None, None),
    ("resnet110", "resnet32", 74.31, 71.14, 73.08, 73.48, 74.11, 73.89),
    ("resnet32x4", "resnet8x4", 79.42, 72.50, 73.33, 75.51, 76.32, None),
    ("wrn_40_2", "wrn_16_2", 75.61, 73.26, 74.92, 75.48, 76.23, 76.12),
    ("wrn_40_2", "wrn_40_1", 75.61, 71.98, 73.54, 74.14, 74.81, None),
    ("vgg13", "vgg8", 74.64, 70.36, 72.98, 73.94, 74.68, None),
    ("vgg13", "mobilenetv2", 74.64, 64.60, 67.37, 69.73, 69.71, None),
    ("resnet50_cifar", "mobilenetv2", 79.34, 64.60, 67.35, 69.11, 70.35, None),
    ("resnet50_cifar", "vgg8", 79.34, 70.36, 73.81, 74.30, None, None),
    ("resnet32x4", "shufflenetv1", 79.42, 70.50, 74.07, 75.11, 76.45, None),
    ("resnet32x4", "shufflenetv2", 79.42, 71.82, 74.45, 75.65, 77.07, None),
    ("wrn_40_2", "shufflenetv1", 75.61, 70.50, 74.83, 76.05, 76.70, None),
)


def _cifar100_grid() -> list[Published]:
    """The CIFAR-100 KD benchmark with CE-trained teachers (CRD, DKD, ReviewKD columns)."""
    out: list[Published] = []
    seen: set[tuple[str, float]] = set()
    for teacher, student, teacher_acc, student_acc, kd, crd, dkd, reviewkd in _CIFAR100_GRID:
        for model, value in ((teacher, teacher_acc), (student, student_acc)):  # trained on labels alone
            if (model, value) not in seen:
                seen.add((model, value))
                out.append(Published(_CRD, "Tables 1-2", "cifar100", None, model, "train", None, "acc", value,
                                     _MAX_TEST, _CRD_SOURCE))
        out.append(Published(_CRD, "Tables 1-2", "cifar100", teacher, student, "kd", "ce", "acc", kd, _MAX_TEST,
                             _CRD_SOURCE))
        out.append(Published(_CRD, "Tables 1-2", "cifar100", teacher, student, "crd", "ce", "acc", crd, _MAX_TEST,
                             _CRD_SOURCE))
        if dkd is not None:
            note = {"wrn_16_2": " (as listed in mdistiller's README)",
                    "shufflenetv2": " (printed there under ResNet32x4 -> MobileNet-V2; the pair is ShuffleNetV2)"}
            out.append(Published(_DKD, "CIFAR-100", "cifar100", teacher, student, "dkd", "ce", "acc", dkd, _MAX_TEST,
                                 _DKD_SOURCE + note.get(student, "")))
        if reviewkd is not None:
            out.append(Published(_REVIEWKD, "CIFAR-100 results", "cifar100", teacher, student, "reviewkd", "ce", "acc",
                                 reviewkd, _MAX_TEST, _REVIEWKD))
    return out


def _logit_anchors() -> list[Published]:
    """Stronger logit-method anchors: CIFAR-100 ResNet32x4 -> ResNet8x4 and ImageNet ResNet-34 -> ResNet-18."""
    sun = "Sun et al. 2024, Logit Standardization in Knowledge Distillation (CVPR)"
    mlkd = "Jin, Wang & Lin 2023, Multi-Level Logit Distillation (CVPR)"
    dot = "Zhao, Cui, Song & Liang 2023, DOT: A Distillation-Oriented Trainer (ICCV)"
    protocol = "as published (the page does not restate the protocol)"
    cifar = [("kd+dot", 75.12, dot, "mdistiller README"), ("kd+ls", 76.62, sun, sun), ("dkd+ls", 77.01, sun, sun),
             ("mlkd", 77.08, mlkd, mlkd), ("mlkd+ls", 78.28, sun, sun)]
    out = [Published(paper, "CIFAR-100", "cifar100", "resnet32x4", "resnet8x4", method, "ce", "acc", value, protocol,
                     source) for method, value, paper, source in cifar]
    imagenet = [("dkd", 71.70, _DKD, _DKD_SOURCE),
                ("dist", 72.07, "Huang et al. 2022, Knowledge Distillation from A Stronger Teacher (NeurIPS)",
                 "Huang et al. 2022"),
                ("kd+ls", 71.42, sun, sun)]
    out += [Published(paper, "ImageNet", "imagenet", "resnet34", "resnet18", method, "ce", "acc", value, protocol,
                      source) for method, value, paper, source in imagenet]
    return out


def _text_anchors() -> list[Published]:
    """Other toolkits' text figures (TextBrewer, torchdistill) and Kim & Rush 2016's sequence-level KD gains."""
    textbrewer, torchdistill = "TextBrewer toolkit, published results table", "torchdistill, published results table"
    out = []
    for metric, teacher_value, student_value in (("em", 81.5, 80.8), ("f1", 88.6, 88.1)):
        out.append(Published(textbrewer, "SQuAD 1.1 dev", "squad", None, "bert-base", "train", None, metric,
                             teacher_value, "SQuAD 1.1 dev, as published", textbrewer))
        out.append(Published(textbrewer, "SQuAD 1.1 dev", "squad", "bert-base", "bert-6-layer", "kd", "ce", metric,
                             student_value, "SQuAD 1.1 dev, as published", textbrewer))
    for model, method, teacher, value in (("bert-large", "train", None, 80.2), ("bert-base", "train", None, 77.9),
                                          ("bert-base", "kd", "bert-large", 78.9)):
        loss = None if teacher is None else "ce"
        out.append(Published(torchdistill, "GLUE test", "glue", teacher, model, method, loss, "glue_test", value,
                             "GLUE test average, as published", torchdistill))
    kim_rush = "Kim & Rush 2016, Sequence-Level Knowledge Distillation (EMNLP)"
    for decoding, gain in (("greedy", 4.2), ("beam", 1.7)):
        out.append(Published(kim_rush, "WMT/IWSLT LSTM students", "translation", None, "lstm", "seqkd", "ce",
                             f"bleu_gain_{decoding}", gain,
                             f"BLEU gained over the student baseline, {decoding} decoding", kim_rush))
    return out


#: every transcribed figure; earlier entries win when two match one report row (the CIFAR-100 grid before
#: Pro-KD's teacher and TA rows, which used another protocol for the same models)
PUBLISHED: tuple[Published, ...] = tuple(_prokd_cifar() + _cifar100_grid() + _logit_anchors()
                                         + _prokd_cifar_teacher_and_assistant() + _prokd_text() + _text_anchors())


def find_published(dataset: str | None, teacher: str | None, student: str | None, method: str | None,
                   teacher_loss: str | None, metric: str = "acc") -> Published | None:
    """The first entry for this (dataset, teacher model, student model, method, teacher loss, metric), or None.
    A ``train`` (no KD) entry ignores the teacher and its loss; an entry without a teacher loss matches any."""
    for entry in PUBLISHED:
        if (entry.dataset, entry.student, entry.method, entry.metric) != (dataset, student, method, metric):
            continue
        if method == "train" or (entry.teacher == teacher and entry.teacher_loss in (None, teacher_loss)):
            return entry
    return None


__all__ = ["Published", "PUBLISHED", "find_published"]
