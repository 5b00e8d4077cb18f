"""The shop's vocabulary: product categories, each with its own attributes, options and price range.

Attributes are properties a product either has or not ("organic", "slim fit"); options are choices the buyer
selects on the item page ("color", "size"). Within a category, option values are disjoint across option names,
so that ``click[<value>]`` on an item page is unambiguous (WebShop's action form).
"""

from __future__ import annotations

from dataclasses import dataclass

COLORS = ("black", "white", "red", "blue", "green", "gray", "navy", "pink", "beige", "brown", "purple", "yellow")


@dataclass(frozen=True)
class CategorySpec:
    """One product category (WebShop's product type)."""

    name: str  # as written in instructions and queries: "t-shirt"
    noun: str  # as written in titles: "T-Shirt"
    countable: bool  # "a t-shirt" vs "coffee"
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, values)
    price: tuple[float, float]
    blurb: str  # one sentence for descriptions


# How an option is phrased in an instruction; "{v}" is the value. Unknown names use "with {name} {v}".
OPTION_PHRASES = {
    "color": "in {v}",
    "size": "in size {v}",
    "flavor": "in {v} flavor",
    "scent": "with {v} scent",
    "model": "for {v}",
}

CATEGORIES: tuple[CategorySpec, ...] = (
    CategorySpec(
        "t-shirt", "T-Shirt", True,
        ("cotton", "slim fit", "machine washable", "short sleeve", "moisture wicking", "crew neck", "relaxed fit", "quick dry"),
        (("color", COLORS), ("size", ("xs", "s", "m", "l", "xl", "xxl"))),
        (7.99, 39.99), "An everyday tee for work, gym and weekends.",
    ),
    CategorySpec(
        "running shoes", "Running Shoes", False,
        ("lightweight", "breathable", "non slip", "arch support", "memory foam", "cushioned", "wide toe box", "rubber sole"),
        (("color", COLORS[:8]), ("size", ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "11", "12"))),
        (29.99, 149.99), "Built for road runs, treadmill sessions and long walks.",
    ),
    CategorySpec(
        "coffee", "Coffee", False,
        ("organic", "fair trade", "low acid", "single origin", "kosher", "small batch", "dark roast", "smooth"),
        (("flavor", ("original", "vanilla", "hazelnut", "caramel", "mocha")), ("size", ("12 oz", "2 lb", "5 lb"))),
        (6.99, 39.99), "Roasted in small lots for a rich, balanced cup.",
    ),
    CategorySpec(
        "phone case", "Phone Case", True,
        ("shockproof", "wireless charging", "slim", "kickstand", "card holder", "scratch resistant", "raised edges", "anti yellowing"),
        (("color", ("black", "clear", "blue", "pink", "green", "purple")),
         ("model", ("iphone 14", "iphone 15", "iphone 15 pro", "galaxy s23", "galaxy s24", "pixel 8"))),
        (5.99, 34.99), "Protects your phone from drops and daily wear.",
    ),
    CategorySpec(
        "headphones", "Headphones", False,
        ("noise cancelling", "wireless", "bluetooth", "over ear", "long battery life", "foldable", "built in microphone", "hi res audio"),
        (("color", ("black", "white", "blue", "silver", "rose gold")),),
        (14.99, 299.99), "Clear sound for music, calls and travel.",
    ),
    CategorySpec(
        "shampoo", "Shampoo", False,
        ("sulfate free", "paraben free", "dry hair", "natural ingredients", "cruelty free", "color safe", "anti dandruff", "vegan"),
        (("scent", ("lavender", "coconut", "mint", "citrus", "unscented")), ("size", ("8 fl oz", "16 fl oz", "33.8 fl oz"))),
        (4.99, 29.99), "Gently cleans and leaves hair soft.",
    ),
    CategorySpec(
        "dog food", "Dog Food", False,
        ("grain free", "high protein", "natural ingredients", "puppy", "small breed", "no artificial flavors", "made in usa", "limited ingredient"),
        (("flavor", ("chicken", "beef", "salmon", "lamb", "turkey")), ("size", ("4 lb", "15 lb", "30 lb"))),
        (9.99, 79.99), "Complete nutrition your dog will love.",
    ),
    CategorySpec(
        "sofa", "Sofa", True,
        ("easy assembly", "mid century", "solid wood legs", "living room", "removable cushions", "stain resistant", "convertible", "velvet"),
        (("color", ("gray", "navy", "beige", "green", "brown", "black")), ("size", ("loveseat", "3 seater", "sectional"))),
        (149.99, 899.99), "A comfortable centerpiece for any living space.",
    ),
    CategorySpec(
        "bed sheets", "Bed Sheets", False,
        ("deep pocket", "wrinkle free", "hypoallergenic", "cooling", "cotton", "breathable", "fade resistant", "machine washable"),
        (("color", COLORS[:10]), ("size", ("twin", "full", "queen", "king", "california king"))),
        (19.99, 119.99), "Soft sheets for a cool, restful night.",
    ),
    CategorySpec(
        "protein bars", "Protein Bars", False,
        ("gluten free", "low sugar", "high protein", "vegan", "keto friendly", "non gmo", "plant based", "individually wrapped"),
        (("flavor", ("chocolate", "peanut butter", "cookie dough", "vanilla almond", "berry")), ("size", ("12 count", "24 count"))),
        (9.99, 44.99), "A filling snack for busy days and workouts.",
    ),
    CategorySpec(
        "backpack", "Backpack", True,
        ("water resistant", "laptop compartment", "lightweight", "usb charging port", "anti theft", "padded straps", "durable", "travel"),
        (("color", COLORS[:9]), ("size", ("20l", "30l", "40l"))),
        (19.99, 129.99), "Carries your laptop and essentials in comfort.",
    ),
    CategorySpec(
        "desk lamp", "Desk Lamp", True,
        ("dimmable", "energy efficient", "usb port", "touch control", "led", "eye caring", "adjustable arm", "memory function"),
        (("color", ("black", "white", "silver", "wood")),),
        (12.99, 79.99), "Bright, even light for reading and work.",
    ),
    CategorySpec(
        "face moisturizer", "Face Moisturizer", True,
        ("fragrance free", "sensitive skin", "anti aging", "oil free", "hyaluronic acid", "spf 30", "non comedogenic", "dermatologist tested"),
        (("size", ("1.7 oz", "2.5 oz", "3.4 oz")),),
        (7.99, 59.99), "Daily hydration that absorbs quickly.",
    ),
)

CATEGORY_BY_NAME = {c.name: c for c in CATEGORIES}

# Syllables for made-up brand names (real brands would be noise for a synthetic catalog).
BRAND_SYLLABLES = ("ka", "lo", "mi", "ra", "ve", "no", "zu", "ti", "sa", "de", "ber", "lin", "tor", "qua", "mo", "fe")
