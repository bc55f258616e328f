"""Deriving a class's structure from meta builds: the formula engine behind formula.py and template_record.py.

    derivation.py  the steps in order and what they yield: the FormulaSpec, as a frozen Derivation
    fields.py      the config's fields: integers (candidate symbols) and flags, under all their spellings
    probe.py       probe builds: the anchor config with some fields changed, built on meta once each (Snapshot)
    screen.py      which fields matter and how they are varied: flags by group testing, integers one at a time,
                   joint variations
    fit.py         each family's multiplicity and dimensions as an exact polynomial in the varied fields
    verify.py      the formula against the builds: every one the fit used, two hold-outs, the split by role

How a formula is derived (nothing is fitted to one point):

1. Build the model on the meta device at the given config (the anchor) and group its parameters into
   families: names equal once layer/expert indices become `*` (`bert.encoder.layer.*.attention.self.query.weight`).
   (probe.py)
2. Sort the config's fields. Integer fields are candidate symbols. Every other field (booleans, strings,
   floats, null fields the config class derives, lists) is a candidate structural flag: all are changed at
   once and the model rebuilt; when its parameters change, the set is halved until each flag that matters is
   found. Those become assumptions (`tie_word_embeddings = true`, `n_inner is not set`). A field has one entry
   however it is spelled: attribute_map aliases (Qwen3-MoE's num_experts is num_local_experts) and the flat
   fields a sub-config is built from (Qwen2.5-VL's hidden_size is text_config.hidden_size) are its spellings,
   varied together. (fields.py, screen.py)
3. Vary each integer field alone, twice, keeping divisibility relations (hidden size by heads) intact. A field
   that changes nothing is independent of the count (BERT's heads); one that adds or removes tensors is
   structural: it is tied to an equal field (ELECTRA's embedding_size = hidden_size) or held fixed.
   Fields that merely happen to be equal at the anchor (K = H in Llama-2, I = 4·D in BERT) are varied
   independently, so each keeps its own symbol. (screen.py)
4. Along each field, every multiplicity and every dimension is fitted as a·x^e + b (e in 1, −1, 2, …);
   the product of those exponent sets gives candidate monomials (K·D/H, N − N_dense, r_kv + d_rope), whose
   coefficients are solved exactly over all builds, including random joint variations. A dimension that no
   polynomial in the fields gives, but one in a whole-number quotient a // b does, gets a derived symbol
   (ViT's positions: Q² + 1 with Q = image_size // patch_size). (fit.py, derivation.py)
5. The formula (Σ multiplicity × Π dimensions) is checked against the meta count at every build, on two
   fresh hold-out builds, and per role at the anchor. Any disagreement raises FormulaMismatchError. (verify.py)

In template mode (template_record.py) each build's snapshot also holds buffers, runs of layers and the module
skeleton, so that a field changing anything a report shows is structural.
"""
