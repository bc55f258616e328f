"""The figures of the foundation issue, exactly, from the bert-base-uncased config."""

from conftest import report_of


def test_bert_model_total_and_embeddings():
    report = report_of("bert-base-uncased", "BertModel")
    assert report.parameters.total == 109_482_240
    assert report.parameters.trainable == 109_482_240
    assert report.parameters.frozen == 0
    assert report.parameters.with_tied_duplicates == 109_482_240
    b = report.breakdown
    assert b["embeddings.word"] == 23_440_896
    assert b["embeddings.position"] == 393_216
    assert b["embeddings.token_type"] == 1_536
    assert b["embeddings.norm"] == 1_536
    assert report.node("embeddings").params == 23_837_184


def test_bert_model_encoder_layers():
    report = report_of("bert-base-uncased", "BertModel")
    layers = report.node("encoder.layer").children
    assert len(layers) == 12
    assert {layer.params for layer in layers} == {7_087_872}
    assert report.node("encoder").params == 85_054_464
    encoder = next(c for c in report.components if c.name == "encoder")
    assert encoder.repeated == ("BertLayer", 12, 7_087_872)
    assert report.num_layers == 12


def test_bert_model_attention_mlp_norms_pooler():
    b = report_of("bert-base-uncased", "BertModel").breakdown
    for role in ("attention.query", "attention.key", "attention.value", "attention.output"):
        assert b[role] == 7_087_104, role
    assert b["mlp.up"] == 28_348_416
    assert b["mlp.down"] == 28_320_768
    assert b["attention.norm"] + b["mlp.norm"] == 36_864
    assert b["pooler"] == 590_592
    # The mission's sketch: feed-forward (56.7M) outweighs attention (28.3M).
    assert b["mlp.up"] + b["mlp.down"] == 56_669_184
    assert sum(b[f"attention.{r}"] for r in ("query", "key", "value", "output")) == 28_348_416


def test_sequence_classification_two_labels():
    report = report_of("bert-base-uncased", "BertForSequenceClassification", num_labels=2)
    assert report.parameters.total == 109_483_778
    assert report.breakdown["head.classifier"] == 1_538  # 768·2 + 2
    assert report.breakdown["pooler"] == 590_592


def test_masked_lm_unique_versus_tied_duplicates():
    report = report_of("bert-base-uncased", "BertForMaskedLM")
    assert report.parameters.total == 109_514_298
    assert report.parameters.with_tied_duplicates == 132_985_716
    groups = {g.canonical: g.aliases for g in report.tied}
    assert groups["bert.embeddings.word_embeddings.weight"] == ("cls.predictions.decoder.weight",)
    assert groups["cls.predictions.bias"] == ("cls.predictions.decoder.bias",)
    assert report.breakdown["head.transform"] == 590_592
    assert report.breakdown["head.transform_norm"] == 1_536
    assert report.breakdown["head.bias"] == 30_522
    assert "pooler" not in report.breakdown


def test_token_classification_has_no_pooler():
    report = report_of("bert-base-uncased", "BertForTokenClassification", num_labels=2)
    assert report.parameters.total == 108_893_186
    assert "pooler" not in report.breakdown
    assert report.breakdown["head.classifier"] == 1_538


def test_bert_base_chinese_masked_lm():
    report = report_of("bert-base-chinese")  # architectures[0] is BertForMaskedLM
    assert report.model.class_name == "BertForMaskedLM"
    assert report.parameters.total == 102_290_312


def test_default_class_is_the_checkpoints_own_and_report_says_why():
    report = report_of("bert-base-uncased")
    assert report.model.class_name == "BertForMaskedLM"
    assert "architectures[0]" in report.model.class_reason
    assert report.model.native is True
    assert report.model.source == "embedded preset google-bert/bert-base-uncased"


def test_buffers_are_counted_separately():
    report = report_of("bert-base-uncased", "BertModel")
    # position_ids and token_type_ids, 1×512 each: not parameters.
    assert report.parameters.buffers == 1_024
    assert {b.name for b in report.buffers} == {"embeddings.position_ids", "embeddings.token_type_ids"}
