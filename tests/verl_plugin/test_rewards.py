"""verl_avspo.verl_plugin.rewards on the answer styles real models produce, and through verl's own loader and
reward manager call (the path ``reward.custom_reward_function`` takes); which data sources verl's own
``default_compute_score`` scores, asked of verl by a call that scores nothing."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.reward import get_custom_reward_fn

from verl_avspo.verl_plugin import rewards
from verl_avspo.verl_plugin.rewards import compute_score, extract_choice, last_boxed_answer

pytestmark = pytest.mark.verl


@pytest.mark.parametrize(
    ("data_source", "response", "gold", "expected"),
    [
        ("math500", r"Adding gives $\boxed{\frac{3}{4}}$.", r"\frac{3}{4}", 1.0),
        ("math500", r"so the answer is $\boxed{\frac{2}{3}}$", r"\frac{3}{4}", 0.0),
        # Equivalent forms.
        ("math500", r"The answer is $\boxed{0.5}$.", r"\frac{1}{2}", 1.0),
        ("math500", r"$\boxed{\frac{1}{2}}$", "0.5", 1.0),
        ("math500", r"$\boxed{\dfrac12}$", r"\frac{1}{2}", 1.0),
        ("olympiadbench", r"Hence $\boxed{x=3}$.", "$3$", 1.0),
        ("gsm8k", r"She pays $\boxed{1,000}$ dollars.", "1000", 1.0),
        ("amc23", r"They meet $\boxed{27}$ miles from A.", "27", 1.0),
        ("math500", r"$\boxed{\left( 3, \frac{\pi}{2} \right)}$", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
        # The last box is the answer, not an intermediate one.
        ("math500", r"First $\boxed{2}$, then correcting: $\boxed{\frac{\sqrt{2}}{2}}$", r"\frac{\sqrt2}{2}", 1.0),
        ("math500", r"First $\boxed{\frac{\sqrt{2}}{2}}$, then correcting: $\boxed{2}$", r"\frac{\sqrt2}{2}", 0.0),
        # Other box spellings models write (verl's box helpers turn these into 0 or an AssertionError).
        ("math500", r"So the answer is $\boxed {5}$.", "5", 1.0),
        ("math500", r"So the answer is \fbox{5}.", "5", 1.0),
        ("math500", r"So the answer is $\boxed 5$.", "5", 1.0),
        ("gsm8k", r"She has $\boxed{\$18}$ left.", "18", 1.0),
        # A box cut off by the length limit is no answer.
        ("math500", r"Thus $\boxed{\frac{1}{", r"\frac{1}{2}", 0.0),
        # Missing box: the right number without the requested format scores 0.
        ("math500", "The answer is 1/2.", r"\frac{1}{2}", 0.0),
        ("gsm8k", "Natalia sold 72 clips.\n#### 72", "72", 0.0),
        ("math500", "", "5", 0.0),
    ],
)
def test_math_scores(data_source, response, gold, expected):
    assert compute_score(data_source, response, gold) == expected


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        (r"The capital is Paris, so $\boxed{C}$.", "C"),
        (r"$\boxed{(C)}$", "C"),
        (r"$\boxed{\text{C}}$", "C"),
        (r"$\boxed{C. Paris}$", "C"),
        (r"$\boxed{\textbf{(C)}}$", "C"),
        (r"$\boxed{\mathrm{C}}$", "C"),
        (r"so \fbox{C}", "C"),
        ("The answer is: C", "C"),
        ("The answer is **(C)**.", "C"),
        ("Paris is option C. The answer is (C).", "C"),
        ("Answer: C", "C"),
        ("At first (A) looked right, but the answer is (J).", "J"),
        ("the answer is a city in France", None),  # the article "a" is not option A
        (r"$\boxed{42}$", None),
        ("I do not know.", None),
    ],
)
def test_choice_extraction(response, letter):
    assert extract_choice(response) == letter


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"first \boxed {3}, finally \boxed{4}", "4"),
        (r"\boxed 12.", "12"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{", None),
        ("no box here", None),
    ],
)
def test_last_boxed_answer(text, answer):
    assert last_boxed_answer(text) == answer


def test_mmlu_pro_dispatch():
    assert compute_score("mmlu_pro", r"$\boxed{C}$", "C") == 1.0
    assert compute_score("mmlu_pro", r"$\boxed{D}$", "C") == 0.0
    # A math scorer would accept neither of these; the choice scorer must.
    assert compute_score("mmlu_pro", "The answer is (I).", "I") == 1.0


def test_unknown_source_goes_to_verl_default():
    # verl's default scorer handles its own names and raises for unknown ones.
    with pytest.raises(NotImplementedError):
        compute_score("no_such_benchmark", r"\boxed{1}", "1")


def test_loaded_by_verl_and_safe_off_the_main_thread():
    """verl loads the scorer from the config and calls it with keywords in an executor thread,
    where math-verify's signal-based timeout cannot run."""
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {"path": "pkg://verl_avspo.verl_plugin.rewards", "name": "compute_score"}
            }
        }
    )
    score_fn = get_custom_reward_fn(config)
    kwargs = {"data_source": "math500", "solution_str": r"$\boxed{0.5}$", "ground_truth": r"\frac12", "extra_info": {}}
    assert score_fn(**kwargs) == 1.0
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(lambda: score_fn(**kwargs)).result() == 1.0
        assert pool.submit(lambda: score_fn(**{**kwargs, "solution_str": r"$\boxed{0.25}$"})).result() == 0.0


@pytest.mark.parametrize(
    "data_source, scored",
    [
        ("openai/gsm8k", True),  # ==
        ("HuggingFaceH4/MATH-500", True),  # in [...]
        ("aime2025", True),  # startswith
        ("codecontests", True),  # a code scorer, which must not run anything
        ("hiyouga/geometry3k", True),
        ("gsm8k", False),  # our short name, not verl's
        ("no_such_benchmark", False),
    ],
)
def test_verl_scores_source_asks_verl(data_source, scored):
    assert rewards.verl_scores_source(data_source) is scored
    # The control: verl itself refuses exactly the sources called unscored.
    refused = False
    try:
        rewards.default_compute_score(data_source, "no answer", "1")
    except NotImplementedError:
        refused = True
    except Exception:  # a scorer that wants other inputs (code tests): scored all the same
        pass
    assert refused is not scored


def test_verl_scores_source_follows_a_verl_with_other_sources(monkeypatch):
    """A verl release that adds or drops a source is followed without any change here; the scorer is
    never given a text to score."""
    seen = []

    def other_verl(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        if data_source != "new_benchmark":
            raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
        seen.append(solution_str)
        return float(str(solution_str) == ground_truth)  # a scorer reading its input fails on the placeholder

    monkeypatch.setattr(rewards, "default_compute_score", other_verl)
    rewards.verl_scores_source.cache_clear()
    try:
        assert rewards.verl_scores_source("new_benchmark") and not rewards.verl_scores_source("openai/gsm8k")
        assert rewards.scores_source("gsm8k") and not rewards.scores_source("aime2025")
        assert len(seen) == 1 and not isinstance(seen[0], str)
    finally:
        rewards.verl_scores_source.cache_clear()
