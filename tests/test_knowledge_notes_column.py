"""The course notes' column of the knowledge table follows the row's model, not its spelling: `learned` and
`dot+learned` are the model `dot` names, and showed no figure."""

from __future__ import annotations

from attnlab.experiments.knowledge import NOTES, parse_variants, results_markdown


def test_every_spelling_of_a_notes_model_gets_its_figure():
    rows = parse_variants("none,learned,synthesizer-dense+learned,rotary,synthesizer-dense+alibi")
    summary = {
        "scale": "quick", "data": {"source": "synthetic", "eval_questions": 10},
        "baselines": {"london": 5.0, "most_common": 5.0, "most_common_answer": "London"},
        "notes": NOTES, "assignment_parameters": 1, "wall_time_s": 1.0,
        "variants": [{"variant": v.name, "label": v.label, "pretrained": v.pretrain, "attention": v.attention,
                      "position": v.position, "accuracy": 1.0, "correct": 1, "train_accuracy": 1.0,
                      "parameters": 1, "wall_time_s": 1.0} for v in rows],
    }
    table = [line.split(" | ") for line in results_markdown(summary).splitlines() if line.startswith("| ")][2:]
    notes = {cells[0].lstrip("| "): cells[4] for cells in table if "always" not in cells[0]}
    assert notes == {"no pretraining": "1.2", "learned (pretrained)": "22.2",
                     "synthesizer-dense+learned (pretrained)": "23.8", "rotary (pretrained)": "—",
                     "synthesizer-dense+alibi (pretrained)": "—"}
