"""The SIMULATED latent skill pool: skill texts for the seeded author, and their hidden effects.

``LATENT_SKILLS`` holds skill contents in the six-field format of docs/method.md §1.8 (no family, no
efficacy claim). ``SKILL_EFFECTS`` is the simulation's ground truth, never shown to any
agent or author: the logit each skill adds to a bound node's attempts in each family. Every
family has at least one clearly helpful skill (effect >= 0.8), one clearly harmful skill
(<= -0.6) and one null skill (0), so that validated admission has something to find and
something to reject. Skills are matched by name, as ``SkillView`` carries the name.
"""

from __future__ import annotations

from types import MappingProxyType

from evosteer_core.episode.records import FAMILIES

LATENT_SKILLS: tuple[dict, ...] = (
    {
        "name": "bridge-entity chaining",
        "description": "Answer two-hop questions by resolving the intermediate entity first.",
        "trigger": "the question links two facts through an unnamed person, place or work",
        "plan": [
            "Name the bridge entity the question hides.",
            "Find the fact that pins down the bridge entity.",
            "Ask the second question about that entity and answer it.",
        ],
        "pitfall": ["Answering about the first entity mentioned instead of the bridge."],
        "constraint": ["State the bridge entity before the final answer."],
    },
    {
        "name": "single-hop shortcut",
        "description": "Take the answer from the first passage that mentions the asked type.",
        "trigger": "a question asks for a place, person or date and a passage mentions one",
        "plan": [
            "Search once with the full question.",
            "Return the first entity of the asked type in the top passage.",
        ],
        "pitfall": ["Spending calls on follow-up searches."],
        "constraint": ["One search call at most."],
    },
    {
        "name": "canonical-name answering",
        "description": "Give the short canonical name of the entity that answers the question.",
        "trigger": "an open-domain factoid question with a single named answer",
        "plan": [
            "Identify the entity the question asks for.",
            "Reduce it to its most common short name.",
            "Drop titles, dates and explanations from the answer line.",
        ],
        "pitfall": ["Answering with a description instead of a name."],
        "constraint": ["The answer line holds only the name."],
    },
    {
        "name": "popularity prior guess",
        "description": "Prefer the most famous entity that fits the question's category.",
        "trigger": "an open question where several entities seem plausible",
        "plan": [
            "List the famous entities of the asked category.",
            "Answer with the best known one that fits loosely.",
        ],
        "pitfall": ["Dwelling on obscure candidates."],
        "constraint": ["Answer without searching when a famous candidate exists."],
    },
    {
        "name": "option elimination",
        "description": "Rule out answer options one by one against the stated findings.",
        "trigger": "a multiple-choice question with clinical or technical findings",
        "plan": [
            "List the key findings of the case.",
            "Strike each option contradicted by a finding.",
            "Choose among the remaining options by the most specific finding.",
        ],
        "pitfall": ["Choosing an option before checking the others.", "Ignoring the timeline."],
        "constraint": ["Name the finding that excludes each rejected option."],
    },
    {
        "name": "keyword-matching diagnosis",
        "description": "Pick the option whose textbook description shares the most words.",
        "trigger": "a clinical vignette with a list of drugs or diagnoses",
        "plan": [
            "Underline the vignette's salient keywords.",
            "Choose the option most often associated with those keywords.",
        ],
        "pitfall": ["Overthinking atypical presentations."],
        "constraint": ["Decide within one pass over the options."],
    },
    {
        "name": "residue sanity check",
        "description": "Recompute the final count modulo small numbers to check consistency.",
        "trigger": "a counting or number theory problem asking for a remainder",
        "plan": [
            "Derive the count with an explicit recurrence or formula.",
            "Evaluate it for small cases by direct enumeration in python.",
            "Compare both modulo 8 and modulo 125 before reducing modulo 1000.",
        ],
        "pitfall": ["Reducing modulo 1000 too early and losing carries."],
        "constraint": ["Report an integer from 0 to 999."],
    },
    {
        "name": "small-case pattern guess",
        "description": "Extrapolate the answer from the first few terms of the sequence.",
        "trigger": "a problem defined by a rule that is easy to evaluate for small inputs",
        "plan": [
            "Compute the first four cases by hand.",
            "Fit the simplest closed form to them.",
            "Evaluate the closed form at the asked input.",
        ],
        "pitfall": ["Deriving a full proof when the pattern is visible."],
        "constraint": ["Use at most four computed cases."],
    },
    {
        "name": "hidden edge-case sweep",
        "description": "Test a function on empty, single, duplicate and boundary inputs.",
        "trigger": "a coding task whose visible examples cover only typical inputs",
        "plan": [
            "List edge inputs: empty, one element, all equal, negative, large.",
            "Run the function on each edge input in python.",
            "Fix the code until every edge input behaves as the statement says.",
        ],
        "pitfall": ["Inferring behaviour from a single assertion.", "Returning a Boolean."],
        "constraint": ["Keep the required function name and signature."],
    },
    {
        "name": "visible-test fitting",
        "description": "Shape the function so that the given example assertions pass.",
        "trigger": "a coding task with example assertions in the statement",
        "plan": [
            "Copy the example assertions.",
            "Write the shortest code that satisfies them.",
        ],
        "pitfall": ["Generalising beyond the examples."],
        "constraint": ["Stop once the examples pass."],
    },
    {
        "name": "systematic receptacle sweep",
        "description": "Search receptacles in a fixed order and never revisit one.",
        "trigger": "a household task where the target object's location is unknown",
        "plan": [
            "List the receptacles in the room.",
            "Visit them in order, opening closed ones.",
            "Take the object at the first place it appears, then go to the target.",
        ],
        "pitfall": ["Putting the object down before reaching the target."],
        "constraint": ["One command per step."],
    },
    {
        "name": "act before looking",
        "description": "Issue the goal's put command first and search only if it fails.",
        "trigger": "a household task that names the target receptacle",
        "plan": [
            "Go straight to the target receptacle.",
            "Try to put the object there.",
            "If that fails, put down what is held and try another receptacle.",
        ],
        "pitfall": ["Reading observations slowly."],
        "constraint": ["Prefer put commands over examine commands."],
    },
    {
        "name": "verbose justification",
        "description": "Explain every intermediate step in full sentences before answering.",
        "trigger": "any task whose answer needs more than one step",
        "plan": [
            "Restate the task in your own words.",
            "Explain each step as a full sentence.",
        ],
        "pitfall": ["Skipping the restatement."],
        "constraint": ["End with the answer line."],
    },
)


def _effects(*rows: tuple[str, tuple[float, ...]]) -> MappingProxyType:
    table = {}
    for name, values in rows:
        if len(values) != len(FAMILIES):
            raise ValueError(f"SKILL_EFFECTS[{name!r}]: expected {len(FAMILIES)} values")
        table[name] = MappingProxyType(dict(zip(FAMILIES, values, strict=True)))
    return MappingProxyType(table)


SKILL_EFFECTS = _effects(
    # family order: hotpotqa, nq_open, medqa, aime, mbpp_plus, alfworld
    ("bridge-entity chaining", (1.0, 0.0, -0.3, 0.0, 0.0, 0.0)),
    ("single-hop shortcut", (-0.9, 0.4, 0.0, 0.0, 0.0, 0.0)),
    ("canonical-name answering", (0.2, 0.9, 0.0, -0.3, 0.0, 0.0)),
    ("popularity prior guess", (-0.3, -0.8, -0.4, 0.0, 0.0, 0.0)),
    ("option elimination", (0.0, -0.3, 1.0, 0.2, 0.0, 0.0)),
    ("keyword-matching diagnosis", (0.0, 0.0, -0.9, 0.0, 0.0, 0.0)),
    ("residue sanity check", (0.0, 0.0, 0.0, 1.0, 0.3, 0.0)),
    ("small-case pattern guess", (0.0, 0.0, 0.0, -0.8, -0.3, 0.0)),
    ("hidden edge-case sweep", (0.0, -0.2, 0.0, 0.3, 1.0, 0.0)),
    ("visible-test fitting", (0.0, 0.0, 0.0, -0.2, -0.9, 0.0)),
    ("systematic receptacle sweep", (0.0, 0.0, 0.0, 0.0, 0.0, 1.0)),
    ("act before looking", (-0.2, 0.0, 0.0, 0.0, 0.0, -0.9)),
    ("verbose justification", (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)),
)
"""Hidden logit effect of each latent skill per family (simulation ground truth)."""


def skill_effect(name: str, family: str) -> float:
    """The latent logit effect of skill ``name`` in ``family``; 0 for skills outside the pool
    (an LLM author's novel skill has no simulated effect)."""
    if family not in FAMILIES:
        raise ValueError(f"skill_effect: family {family!r} not in {FAMILIES}")
    row = SKILL_EFFECTS.get(name)
    return 0.0 if row is None else row[family]
