"""Write configs/glue/ and configs/squad/: the Pro-KD paper's GLUE and SQuAD experiments (Tables 4-10, appendix B).

Two teacher / assistant / student triples (section 5.2): BERT -- bert-large-uncased / bert-base-uncased (TAKD's
assistant) / BERT-Small google/bert_uncased_L-4_H-512_A-8 -- and RoBERTa -- roberta-large / roberta-base /
distilroberta-base. Per GLUE task (cola sst2 mrpc stsb qqp mnli qnli rte wnli) and pair:

    teacher.yaml         CE fine-tuning, epochs = tau_max, every epoch recorded (train.save_every=1)
    nokd.yaml            the student on labels only (teachkit train)
    kd.yaml              Hinton KD from the final teacher, alpha 0.5
    prokd.yaml           Pro-KD replaying the teacher's trajectory (tau_max, n_i), then phase II on labels
    annealing.yaml       Annealing-KD: final teacher, Pro-KD's temperature schedule and phase split
    rco.yaml             RCO: Hinton KD from the recorded teacher checkpoints in order
    takd.yaml            TAKD: teacher -> assistant (KD) -> student (KD)
    eskd.yaml            ESKD: one KD student per recorded teacher epoch, the best on validation kept
    teacher_mse.yaml     the teacher trained with train.loss=mse (ECCV 2024's MSE teacher)
    kd_mse_teacher.yaml  Hinton KD from that MSE teacher

STS-B is regression (one output, train.loss=l2): only teacher.yaml and nokd.yaml are written. In the paper,
distillation on STS-B regresses the student's output on the teacher's output (Pro-KD's logit regression), but
every teachkit distillation recipe (KD, Pro-KD, Annealing-KD, RCO, TAKD, ESKD) takes its teacher from
TeacherSource, which refuses real-valued targets, and the MSE teacher objective needs class labels. SQuAD
v1.1 and v2.0 (Tables 8-9, appendix Tables 14-15), both pairs: teacher, nokd, kd, prokd, takd (QA head;
logits (B, L, 2), so CE, KD and Pro-KD's squared error act over token positions for start and end).

Run names are flat (``glue-bert-sst2-prokd``; a run name may not hold ``/``), out_dir ``runs``; the students
read the teacher from ``runs/<teacher name>``. Each file's first line is the command that runs it.

Sources of the settings (paper = Pro-KD, appendix B Tables 11-15 unless said; HF = Hugging Face Trainer /
run_glue.py / run_qa.py defaults; ours = our choice where both are silent):

    setting                     value                                   source
    GLUE batch / max length     32 / 128                                paper Table 12
    GLUE grad clip              1.0                                     paper Table 12 (also HF max_grad_norm)
    GLUE KD alpha               0.5                                     paper Table 12 ("vanilla KD alpha")
    GLUE lr, BERT-Small         5e-5 RTE, MRPC; 2e-5 others             paper Table 11, section 5.2
    GLUE lr, DistilRoBERTa      2e-5                                    paper Table 13, section 5.2
    GLUE teacher lr             the same as the student's for the task  ours (Tables 11/13 list one lr beside
                                                                        the teacher epochs; none is separate)
    GLUE tau_max = teacher ep.  7 BERT, 5 RoBERTa                       paper Tables 11, 13
    Pro-KD n_i                  1 BERT, 2 RoBERTa (phase I 7 / 10 ep.)  paper section 5.2
    Pro-KD phase II             10 epochs (GLUE)                        paper Tables 11, 13
    student budget (all)        phase I + phase II = 17 BERT, 20 RoB.   paper section 4 (Pro-KD's total = the
                                                                        KD baselines' epochs)
    T schedule                  T_i = tau_max - (i - 1), per epoch      paper Eq. 3 (prokd.stage_epochs=1)
    Pro-KD teacher checkpoint   after teacher epoch i (checkpoint_at)   METHODS.md section 3 default
    Pro-KD squared error        mean over elements (reduction mean)     ours, as the CIFAR Pro-KD configs and
                                                                        the public Annealing-KD code (MSELoss);
                                                                        under AdamW the loss scale barely
                                                                        matters; SQuAD's sum would add 384
                                                                        positions per window
    optimiser / schedule        AdamW betas (0.9, 0.999), linear decay  HF defaults (paper silent)
    warm-up                     0                                       HF default (warmup_ratio 0)
    weight decay                0.01; 0.0 for DistilRoBERTa on SQuAD    BERT/RoBERTa fine-tuning convention
                                                                        (HF default is 0.0); Table 14 writes
                                                                        "-" for the DistilRoBERTa student
    KD temperature              2.0                                     ours (paper silent; DistilBERT's T)
    RCO anchors                 every recorded teacher epoch (7 / 5)    ours (paper silent; no search)
    ESKD                        eskd.search=true, best student on val   paper section 3.2 / METHODS.md section 4
    TAKD assistant epochs       = the student's budget                  ours (takd.assistant_epochs unset)
    SQuAD batch / length / stride  12 / 384 / 128                       paper Tables 14-15, section 5.3
    SQuAD max query length      64                                      HF run_squad / teachkit default
    SQuAD tau_max = teacher ep. 3, n_i 1                                paper section 5.3, Tables 14-15
    SQuAD student lr            3e-5                                    paper Tables 14-15
    SQuAD teacher lr, wd        BERT 3e-5; RoBERTa 1.5e-5, wd 0.01      paper Tables 15 / 14 (see below)
    SQuAD phase II              BERT 5, RoBERTa 6 epochs                paper Tables 15 / 14 (see below)
    eval batch size             128                                     ours (memory; HF default 8)
    validation split            10% of train, seeded                    teachkit default (GLUE/SQuAD dev =
                                                                        the test split; selection on val)

Which SQuAD table is which: the OCR'd appendix prints the table with teacher lr 1.5e-5, weight decay 0.01 and
6 phase-II epochs just before the caption "Table 14: ... DistilRoBERTa on SQuAD", and the table with teacher
lr 3e-5 and 5 phase-II epochs just after "Table 15: ... BERT-Small on SQuAD". We read it so (1.5e-5 with wd 0.01
is also RoBERTa's own SQuAD fine-tuning recipe). METHODS.md section 6 quotes the first table's values without
naming the model; where the two differ, these configs follow the paper as read here.

Models are named as on the Hugging Face Hub and must already be in the local cache (nothing is downloaded);
override model.options.path / data.options.tokenizer with a folder otherwise. The tokenizer is the student's:
each pair shares one vocabulary (uncased WordPiece; RoBERTa's BPE).

It also writes the sweep files that run these configs as paper tables (``teachkit sweep``), one per dataset and
pair: sweeps/prokd_glue_{bert,roberta}.yaml (GLUE dev, Tables 6 and 4: NoKD, KD, TAKD, RCO, Annealing-KD, Pro-KD
per task; STS-B NoKD only) and sweeps/prokd_squad_{bert,roberta}.yaml (Tables 9 and 8: NoKD, KD, TAKD, Pro-KD per
SQuAD version), 3 student seeds each. Every entry's base is the config written here; the teacher is given
in-command, copied from the task's teacher.yaml (teacher.seed 0: one teacher for all seeds), so the sweep trains
it once, recorded every epoch, and Pro-KD runs with prokd.mode=auto (replaying it) instead of replay.

    python scripts/generate_text_configs.py          # rewrite the folders and the sweep files
    python scripts/generate_text_configs.py --check  # exit 1 if a file is out of date
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "configs"
SWEEPS = REPO / "sweeps"

TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
REGRESSION = {"stsb"}
METHODS = ["teacher", "nokd", "kd", "prokd", "annealing", "rco", "takd", "eskd", "teacher_mse", "kd_mse_teacher"]
SQUAD_METHODS = ["teacher", "nokd", "kd", "prokd", "takd"]
SQUAD_VERSIONS = ["1.1", "2.0"]

WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
KD_ALPHA = 0.5
KD_TEMPERATURE = 2.0
EVAL_BATCH = 128


@dataclass(frozen=True)
class Pair:
    """One teacher / assistant / student triple and its settings."""

    teacher: str
    assistant: str
    student: str
    tau_max: int  # GLUE: teacher epochs = tau_max
    n_i: int  # GLUE: student epochs per teacher epoch
    glue_lr: dict[str, float]  # per task (teacher and students)
    squad_teacher_lr: float
    squad_teacher_wd: float
    squad_student_wd: float
    squad_phase2: int


PAIRS = {
    "bert": Pair("bert-large-uncased", "bert-base-uncased", "google/bert_uncased_L-4_H-512_A-8", tau_max=7, n_i=1,
                 glue_lr={t: 5e-5 if t in ("rte", "mrpc") else 2e-5 for t in TASKS},
                 squad_teacher_lr=3e-5, squad_teacher_wd=WEIGHT_DECAY, squad_student_wd=WEIGHT_DECAY, squad_phase2=5),
    "roberta": Pair("roberta-large", "roberta-base", "distilroberta-base", tau_max=5, n_i=2,
                    glue_lr={t: 2e-5 for t in TASKS},
                    squad_teacher_lr=1.5e-5, squad_teacher_wd=0.01, squad_student_wd=0.0, squad_phase2=6),
}
GLUE_PHASE2 = 10
SQUAD_TAU_MAX, SQUAD_N_I, SQUAD_LR = 3, 1, 3e-5
PRETTY = {"bert": ("BERT-Large", "BERT-Base", "BERT-Small"), "roberta": ("RoBERTa-Large", "RoBERTa-Base",
                                                                          "DistilRoBERTa")}


def optim(lr: float, weight_decay: float) -> dict:
    return {"name": "adamw", "lr": lr, "weight_decay": weight_decay, "betas": [0.9, 0.999], "schedule": "linear",
            "warmup_epochs": 0.0, "grad_clip": GRAD_CLIP}


def model(path: str, head: str) -> dict:
    return {"name": "hf_text", "options": {"path": path, "head": head}}


@dataclass(frozen=True)
class Setting:
    """What the configs of one (dataset, pair) share: data section, head, budgets, lrs, run-name prefix."""

    prefix: str  # run names: <prefix>-<method>
    folder: str  # configs/<folder>/<method>.yaml
    data: dict
    head: str
    root_hint: str
    tau_max: int
    n_i: int
    phase2: int
    lr: float
    teacher_lr: float
    teacher_wd: float
    student_wd: float
    regression: bool = False

    @property
    def student_epochs(self) -> int:
        return self.tau_max * self.n_i + self.phase2


def glue_setting(pair_name: str, task: str) -> Setting:
    pair = PAIRS[pair_name]
    lr = pair.glue_lr[task]
    data = {"name": "glue", "root": "data/glue", "batch_size": 32, "eval_batch_size": EVAL_BATCH,
            "options": {"task": task, "tokenizer": pair.student, "max_length": 128}}
    return Setting(f"glue-{pair_name}-{task}", f"glue/{pair_name}/{task}", data, "sequence", "/path/to/glue",
                   pair.tau_max, pair.n_i, GLUE_PHASE2, lr, lr, WEIGHT_DECAY, WEIGHT_DECAY, task in REGRESSION)


def squad_setting(pair_name: str, version: str) -> Setting:
    pair = PAIRS[pair_name]
    data = {"name": "squad", "root": "data/squad", "batch_size": 12, "eval_batch_size": EVAL_BATCH,
            "options": {"version": version, "tokenizer": pair.student, "max_length": 384, "doc_stride": 128,
                        "max_query_length": 64}}
    return Setting(f"squad-v{version}-{pair_name}", f"squad/{pair_name}/v{version}", data, "qa", "/path/to/squad",
                   SQUAD_TAU_MAX, SQUAD_N_I, pair.squad_phase2, SQUAD_LR, pair.squad_teacher_lr,
                   pair.squad_teacher_wd, pair.squad_student_wd)


def config(pair_name: str, s: Setting, method: str) -> tuple[dict, str, str, str | None]:
    """(config, command, description, the config to run first) for ``method`` in setting ``s``."""
    pair = PAIRS[pair_name]
    t_name, a_name, s_name = PRETTY[pair_name]
    loss = "l2" if s.regression else "ce"
    teacher_file = f"configs/{s.folder}/teacher.yaml"
    if method in ("teacher", "teacher_mse"):
        mse = method == "teacher_mse"
        train = {"epochs": s.tau_max, "loss": "mse" if mse else loss}
        if not mse:
            train["save_every"] = 1
        cfg = {"name": f"{s.prefix}-{method}", "data": s.data, "model": model(pair.teacher, s.head),
               "optim": optim(s.teacher_lr, s.teacher_wd), "train": train}
        what = (f"{t_name} teacher trained with MSE between softmax and one-hot (ECCV 2024), {s.tau_max} epochs"
                if mse else f"{t_name} teacher, {loss.upper()} fine-tuning for tau_max = {s.tau_max} epochs, every "
                            f"epoch recorded (save_every 1) for Pro-KD replay, RCO and ESKD")
        if s.regression:
            what += ("; STS-B regression: only this teacher and nokd.yaml are shipped, as teachkit's distillation "
                     "recipes refuse real-valued targets (the paper distils STS-B by regressing the student's "
                     "output on the teacher's, i.e. Pro-KD's logit regression)")
        return cfg, "train", what, None
    base = {"name": f"{s.prefix}-{method}", "data": s.data, "model": model(pair.student, s.head),
            "optim": optim(s.lr, s.student_wd), "train": {"epochs": s.student_epochs}}
    if method == "nokd":
        base["train"]["loss"] = loss
        return base, "train", f"{s_name} on labels only (no teacher), {s.student_epochs} epochs", None
    teacher = {"checkpoint": f"runs/{s.prefix}-teacher", "select": "last"}
    kd = {"method": "kd", "alpha": KD_ALPHA, "temperature": KD_TEMPERATURE}
    phase1 = s.tau_max * s.n_i
    schedule = {"tau_max": s.tau_max, "stage_epochs": 1, "student_epochs": s.n_i, "checkpoint_at": "end",
                "reduction": "mean"}
    budget = f"{s_name} student, {s.student_epochs} epochs"
    if method == "kd":
        return ({**base, "teacher": teacher, "kd": kd}, "distill",
                f"Hinton KD from the final {t_name} teacher, alpha {KD_ALPHA}, T {KD_TEMPERATURE:g}. {budget}",
                teacher_file)
    if method == "kd_mse_teacher":
        return ({**base, "teacher": {**teacher, "checkpoint": f"runs/{s.prefix}-teacher_mse"}, "kd": kd}, "distill",
                f"Hinton KD (alpha {KD_ALPHA}, T {KD_TEMPERATURE:g}) from the MSE-trained {t_name} teacher. {budget}",
                f"configs/{s.folder}/teacher_mse.yaml")
    if method == "prokd":
        return ({**base, "teacher": teacher, "prokd": {"mode": "replay", **schedule}}, "run prokd",
                f"Pro-KD replaying the recorded teacher: tau_max {s.tau_max}, T down by 1 per teacher epoch, n_i "
                f"{s.n_i} (phase I = {phase1} epochs of ||z_s - z_t(theta_i)/T_i||^2, mean reduction), then phase II "
                f"= {s.phase2} epochs of CE. {budget}", teacher_file)
    if method == "annealing":
        return ({**base, "teacher": teacher, "prokd": schedule}, "run annealing",
                f"Annealing-KD from the final teacher with Pro-KD's T schedule and phase split ({phase1} + "
                f"{s.phase2} epochs). {budget}", teacher_file)
    if method == "rco":
        return ({**base, "teacher": teacher, "rco": {"anchors": s.tau_max}, "kd": kd}, "run rco",
                f"RCO: Hinton KD (alpha {KD_ALPHA}, T {KD_TEMPERATURE:g}) following the teacher after each of its "
                f"{s.tau_max} epochs in order. {budget}", teacher_file)
    if method == "takd":
        return ({**base, "teacher": teacher, "takd": {"assistant": model(pair.assistant, s.head)}, "kd": kd},
                "run takd", f"TAKD: {t_name} -> {a_name} (assistant, KD) -> {s_name} (KD), alpha {KD_ALPHA}, T "
                            f"{KD_TEMPERATURE:g}, each {s.student_epochs} epochs", teacher_file)
    if method == "eskd":
        return ({**base, "teacher": teacher, "eskd": {"search": True}, "kd": kd}, "run eskd",
                f"ESKD / checkpoint search: one KD student (alpha {KD_ALPHA}, T {KD_TEMPERATURE:g}) per recorded "
                f"teacher epoch 1..{s.tau_max}, the best on validation kept. {budget}", teacher_file)
    raise ValueError(method)


def render(cfg: dict, command: str, description: str, after: str | None, path: Path, root_hint: str) -> str:
    rel = path.relative_to(REPO)
    line = f"# teachkit {command} {rel} data.root={root_hint}"
    if after:
        line += f"   (after {after})"
    return f"{line}\n# {description}\n" + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None, width=120)


def settings() -> list[tuple[str, Setting, list[str]]]:
    out = []
    for pair in PAIRS:
        for task in TASKS:
            methods = ["teacher", "nokd"] if task in REGRESSION else METHODS
            out.append((pair, glue_setting(pair, task), methods))
    for pair in PAIRS:
        for version in SQUAD_VERSIONS:
            out.append((pair, squad_setting(pair, version), SQUAD_METHODS))
    return out


def all_files() -> dict[Path, str]:
    files = {}
    for pair, s, methods in settings():
        for method in methods:
            path = ROOT / s.folder / f"{method}.yaml"
            cfg, command, description, after = config(pair, s, method)
            files[path] = render(cfg, command, description, after, path, s.root_hint)
    return files


# ----------------------------------------------------------------------------- sweep files

#: the methods of the paper's tables run by the sweeps (the configs' ESKD and MSE-teacher KD are left out), and the
#: recipe each runs under
SWEEP_METHODS = {"nokd": "train", "kd": "kd", "takd": "takd", "rco": "rco", "annealing": "annealing", "prokd": "prokd"}
SQUAD_SWEEP_METHODS = [m for m in SWEEP_METHODS if m in SQUAD_METHODS]
SEEDS = [0, 1, 2]
#: which table of the Pro-KD paper each sweep reproduces
SWEEP_TABLES = {("glue", "bert"): "Table 6 (GLUE dev; Table 7 is GLUE test)",
                ("glue", "roberta"): "Table 4 (GLUE dev; Table 5 is GLUE test)",
                ("squad", "bert"): "Table 9", ("squad", "roberta"): "Table 8"}
#: rough cost, our estimate from model sizes and dataset sizes (not measured)
SWEEP_COST = {"glue": "dominated by MNLI and QQP (~390k / ~360k training pairs): a few hundred GPU-hours on one "
                      "modern GPU, most of it the large teachers and TAKD's base-size assistants",
              "squad": "~90k (v1.1) / ~130k (v2.0) training questions at 384 tokens: on the order of 100 GPU-hours "
                       "on one modern GPU, most of it the large teachers and TAKD's base-size assistants"}


def teacher_section(pair_name: str, s: Setting) -> dict:
    """The in-command teacher equal to ``s``'s teacher.yaml: its model, optimiser, epochs and loss, seed 0."""
    cfg = config(pair_name, s, "teacher")[0]
    assert cfg["data"] == s.data  # the teacher reads the student's data section (tokenizer included)
    return {"checkpoint": None, "select": "last", "model": cfg["model"], "optim": cfg["optim"],
            "epochs": cfg["train"]["epochs"], "loss": cfg["train"]["loss"], "seed": 0}


def dotted_diff(common: dict, specific: dict, prefix: str = "") -> dict:
    """The leaves of ``specific`` that differ from ``common``, as dotted keys (both with the same keys)."""
    assert common.keys() == specific.keys()
    out = {}
    for k, v in specific.items():
        if isinstance(v, dict) and isinstance(common[k], dict):
            out.update(dotted_diff(common[k], v, f"{prefix}{k}."))
        elif v != common[k]:
            out[f"{prefix}{k}"] = v
    return out


def flow(value: dict) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=True, width=10_000).strip()


def sweep_text(dataset: str, pair_name: str) -> str:
    """The sweep file of ``dataset`` (glue, squad) for ``pair_name``: one list entry per (task, method)."""
    t_name, a_name, s_name = PRETTY[pair_name]
    rows = []  # (label prefix, setting, methods)
    if dataset == "glue":
        for task in TASKS:
            rows.append((task, glue_setting(pair_name, task), ["nokd"] if task in REGRESSION else list(SWEEP_METHODS)))
    else:
        for version in SQUAD_VERSIONS:
            rows.append((f"v{version}", squad_setting(pair_name, version), SQUAD_SWEEP_METHODS))
    teachers = {prefix: teacher_section(pair_name, s) for prefix, s, methods in rows if methods != ["nokd"]}
    common = next(iter(teachers.values()))
    entries = []
    for prefix, s, methods in rows:
        for method in methods:
            entry: dict = {"label": f"{prefix}-{method}", "base": f"../configs/{s.folder}/{method}.yaml",
                           "recipe": SWEEP_METHODS[method]}
            if method != "nokd":
                entry.update(dotted_diff(common, teachers[prefix], "teacher."))
            if method == "prokd":
                assert config(pair_name, s, method)[0]["prokd"]["mode"] == "replay"
                entry["prokd.mode"] = "auto"
            entries.append(f"  - {flow(entry)}\n")
    s0 = rows[0][1]
    unit = "task" if dataset == "glue" else "SQuAD version"
    names = ", ".join(m for m in SWEEP_METHODS if m in rows[0][2])
    what = ("GLUE, per task (CoLA, SST-2, MRPC, QQP, MNLI, QNLI, RTE, WNLI; STS-B NoKD only)" if dataset == "glue"
            else "SQuAD v1.1 and v2.0")
    n_students = sum(len(m) for _, _, m in rows) * len(SEEDS)
    n_takd = sum(1 for _, _, m in rows if "takd" in m) * len(SEEDS)
    paragraphs = [
        f"Pro-KD (Rezagholizadeh et al. 2022), {SWEEP_TABLES[dataset, pair_name]}: {s_name} from {t_name}, {what}: "
        f"{names}; {len(SEEDS)} student seeds -> {n_students} students, {len(teachers)} shared teachers (one per "
        f"{unit}, recorded every epoch), {n_takd} shared TAKD assistants ({a_name}, one per {unit} and seed).",
        f"   teachkit sweep sweeps/prokd_{dataset}_{pair_name}.yaml data.root={s0.root_hint} [--workers N]",
        f"data.root is given at run time (the configs keep root: {s0.data['root']}). Generated by "
        f"scripts/generate_text_configs.py (do not edit by hand): each entry runs configs/{dataset}/{pair_name}/"
        f"<{unit.split()[-1]}>/<method>.yaml (see its header and the script's table of sources: tau_max "
        f"{s0.tau_max} = teacher epochs, n_i {s0.n_i}, phase I {s0.tau_max * s0.n_i} + phase II {s0.phase2} = "
        f"{s0.student_epochs} student epochs) with the teacher given in-command, copied from that folder's "
        f"teacher.yaml (the student's tokenizer, as there: each pair shares one vocabulary), and prokd.mode=auto "
        f"instead of replay (it replays the shared recorded teacher).",
    ]
    if dataset == "glue":
        paragraphs.append("STS-B (regression) has only NoKD: teachkit's distillation recipes refuse real-valued "
                          "targets, so its distilled cells cannot be run (see the script's docstring). GLUE's test "
                          "labels are hidden: the dev set is the test split, so this is the dev table; the test "
                          "table needs the GLUE server. ESKD and KD from the MSE teacher (configs there too) are "
                          "not in the paper's tables and are left out.")
    paragraphs += [
        f"Not fixed by the paper (our choices): one teacher per {unit} (teacher.seed 0) for all student seeds; "
        f"3 student seeds (train.seed 0, 1, 2); TAKD's assistant trained once per student seed; no report baseline "
        f"(each {unit}'s NoKD row is its own baseline, and a report takes one baseline row).",
        f"Rough cost (our estimate, not measured): {SWEEP_COST[dataset]}.",
    ]
    header = "".join(
        f"#{p}\n" if p.startswith("  ") else "\n".join(textwrap.wrap(p, 118, initial_indent="# ",
                                                                     subsequent_indent="# ")) + "\n"
        for p in paragraphs)
    body = {"sweep": f"prokd-{dataset}-{pair_name}", "out_dir": "runs/sweeps", "config": {"teacher": common},
            "grid": {"train.seed": SEEDS}}
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120)
    return header + text + "list:\n" + "".join(entries)


def sweep_files() -> dict[Path, str]:
    return {SWEEPS / f"prokd_{dataset}_{pair}.yaml": sweep_text(dataset, pair)
            for dataset in ("glue", "squad") for pair in PAIRS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    files = all_files()
    sweeps = sweep_files()
    files.update(sweeps)
    if args.check:
        stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
        extra = sorted(p for sub in ("glue", "squad") for p in (ROOT / sub).rglob("*.yaml") if p not in files)
        for p in stale:
            print(f"out of date: {p}")
        for p in extra:
            print(f"not generated: {p}")
        return 1 if stale or extra else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(files) - len(sweeps)} configs under {ROOT / 'glue'} and {ROOT / 'squad'}, "
          f"{len(sweeps)} sweep files under {SWEEPS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
