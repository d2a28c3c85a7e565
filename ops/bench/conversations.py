"""What the chat-turns workload of `brigade bench serve` says: tenants, each with one long system
prompt that its conversations share, and conversations of short user turns.

Turn k of a conversation sends its tenant's system prompt, then every earlier user turn each
followed by the answer the server actually gave it, then user turn k: 2k messages, each turn's
prompt beginning with the whole of the previous one (what a prefix cache can reuse).

Pure and deterministic: the same seed gives the same text, with no model and no network. A system
prompt is sized in characters from CHARS_PER_TOKEN, not by a tokenizer (a bench aimed at another
server may have no tokenizer of the model at hand).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

# The default model's tokenizer (SmolLM2) reads these sentences at about this many characters a
# token (measured: 700 tokens asked, 687-704 counted, over the first eight tenants of seeds 0-3;
# tests/test_bench_multiturn.py counts them again).
CHARS_PER_TOKEN = 5.0

# A tenant's system prompt: its own first sentence (so that no two tenants share even a prefix
# block), then these in an order of its own, repeated (reshuffled) until it is long enough.
POLICY_SENTENCES = (
    "Answer in plain language and keep each reply short unless the customer asks for detail.",
    "Greet the customer only once, at the start of the conversation, and never repeat the greeting.",
    "If you do not know the answer, say so and suggest where the customer could find it.",
    "Never invent order numbers, prices, delivery dates or the names of members of staff.",
    "Refunds are possible within thirty days of delivery for items in their original packaging.",
    "Exchanges for a different size or colour are free when the customer asks within sixty days.",
    "Shipping is free for orders above fifty euros; below that it costs four euros ninety.",
    "Express delivery arrives the next working day when the order is placed before two o'clock.",
    "Customers may change their delivery address until the parcel has left the warehouse.",
    "A damaged parcel should be photographed before it is opened, and the photo sent to support.",
    "Gift cards are valid for three years and cannot be exchanged for cash.",
    "Loyalty points are earned on every purchase and expire after eighteen months without an order.",
    "Do not ask for passwords, full card numbers or security codes, and refuse if they are offered.",
    "When a customer is upset, acknowledge the problem first and then explain the next step.",
    "Offer to hand the conversation to a person when the customer asks for one, without arguing.",
    "Business customers with an account manager should be referred to that manager by name.",
    "Warranty claims need the proof of purchase and a short description of the fault.",
    "Repairs under warranty take about ten working days from the day the item reaches the workshop.",
    "Products bought in a physical shop can be returned online, and the other way round.",
    "Prices shown on the website include value added tax for customers inside the union.",
    "Answer questions about competitors' products politely, without comparing or criticising them.",
    "Use the metric system for sizes and weights unless the customer uses other units first.",
    "Write dates as day, month and year, and times on the twenty-four hour clock.",
    "End a reply with a question only when you need something from the customer to go on.",
    "Keep a friendly, calm tone, and do not use exclamation marks more than once per reply.",
    "If a question is about health, law or money beyond our products, recommend a professional.",
)

TENANT_NAMES = ("Northwind Outfitters", "Blue Heron Books", "Copperleaf Kitchens", "Vela Cycles", "Harbor & Pine",
                "Quarry Lane Toys", "Saltmarsh Garden Supply", "Orbit Audio", "Fernhill Pharmacy", "Tallow & Wick",
                "Granite Peak Sports", "Little Lantern Crafts")

TOPICS = ("returning a pair of shoes", "a late parcel", "a broken kettle", "changing my delivery address",
          "a gift card", "loyalty points", "an express delivery", "a damaged parcel", "a warranty claim",
          "a jacket in the wrong size", "free shipping", "a repair", "paying with an invoice", "a missing item",
          "a discount code", "cancelling an order", "a product manual", "an exchange in a shop",
          "a double charge on my card", "a back-ordered lamp", "a present for my sister", "bulk orders",
          "a price that dropped after I bought", "a parcel left with a neighbour")

# User turns: turn k asks TURN_QUESTIONS[k - 1] about the conversation's topic (each names it, so
# that no two conversations ever send the same message).
TURN_QUESTIONS = (
    "I have a question about {topic}. What should I know first?",
    "Why does that matter in my case, with {topic}?",
    "Can you give me one concrete example of what to do about {topic}?",
    "What is a common mistake people make with {topic}?",
    "How would you sum up {topic} in one sentence?",
    "What should I do next about {topic}?",
)


@dataclass(frozen=True)
class ChatTurns:
    """The workload's size: `conversations` of `turns` turns each, spread round-robin over `tenants`
    (each with a system prompt of about `system_tokens` tokens), seeded by `seed`."""

    conversations: int = 8
    turns: int = 4
    tenants: int | None = None  # None: one per conversation
    system_tokens: int = 700
    seed: int = 0

    def __post_init__(self):
        if min(self.conversations, self.turns, self.system_tokens) < 1:
            raise ValueError("--conversations, --turns and --system-tokens must be at least 1")
        if self.tenants is not None and not 1 <= self.tenants <= self.conversations:
            raise ValueError("--tenants is from 1 up to --conversations (each tenant needs a conversation)")

    @property
    def tenant_count(self) -> int:
        return self.tenants or self.conversations

    @property
    def requests(self) -> int:
        return self.conversations * self.turns

    def to_json(self) -> dict:
        return {"name": "chat-turns", "conversations": self.conversations, "turns": self.turns,
                "tenants": self.tenant_count, "system_tokens": self.system_tokens}


@dataclass(frozen=True)
class Conversation:
    index: int
    tenant: int
    system_prompt: str
    user_turns: tuple[str, ...]

    def messages(self, turn: int, answers: list[str]) -> list[dict]:
        """What turn `turn` (1-based) sends: the system prompt, each earlier user turn with the
        answer it got (`answers[i]` for turn i + 1), then this turn's user message."""
        if len(answers) < turn - 1:
            raise ValueError(f"turn {turn} needs the answers of the {turn - 1} turns before it")
        out = [{"role": "system", "content": self.system_prompt}]
        for question, answer in zip(self.user_turns[:turn - 1], answers):
            out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        return out + [{"role": "user", "content": self.user_turns[turn - 1]}]


def system_prompt(tenant: int, tokens: int, seed: int) -> str:
    """Tenant `tenant`'s system prompt, about `tokens` tokens long (CHARS_PER_TOKEN)."""
    name = TENANT_NAMES[tenant % len(TENANT_NAMES)]
    sentences = [f"You are the customer support assistant of {name} (tenant {tenant + 1}); "
                 f"follow these rules in every reply."]
    rng = random.Random(f"system-prompt:{seed}:{tenant}")
    deck: list[str] = []
    while sum(len(s) + 1 for s in sentences) < tokens * CHARS_PER_TOKEN:
        if not deck:
            deck = list(POLICY_SENTENCES)
            rng.shuffle(deck)
        sentences.append(deck.pop())
    return " ".join(sentences)


def user_turn(conversation: int, turn: int, seed: int) -> str:
    """Conversation `conversation`'s user message at turn `turn` (1-based): a short question about
    its own topic, never the same as another turn's of the same conversation."""
    offset = random.Random(f"topics:{seed}").randrange(len(TOPICS))
    topic = TOPICS[(conversation + offset) % len(TOPICS)]
    if conversation >= len(TOPICS):
        topic += f" (my case number {conversation + 1})"
    if turn <= len(TURN_QUESTIONS):
        return TURN_QUESTIONS[turn - 1].format(topic=topic)
    return f"Follow-up {turn}: tell me one more thing about {topic}."


def plan_conversations(workload: ChatTurns) -> list[Conversation]:
    """Every conversation of the workload; conversation i belongs to tenant i mod tenants."""
    prompts = [system_prompt(t, workload.system_tokens, workload.seed) for t in range(workload.tenant_count)]
    return [Conversation(i, i % workload.tenant_count, prompts[i % workload.tenant_count],
                         tuple(user_turn(i, k, workload.seed) for k in range(1, workload.turns + 1)))
            for i in range(workload.conversations)]
