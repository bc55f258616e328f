"""The longest context a config allows (dims.max_context), held to the real classes."""
import pytest
import torch
import transformers

from paramscope.cost.dims import PADDING_OFFSET_POSITIONS, max_context

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99,
            max_position_embeddings=40)


def _position_tables(model_type):
    config = transformers.AutoConfig.for_model(model_type, **TINY)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    return config, [m for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Embedding) and n.endswith("position_embeddings")]


@pytest.mark.parametrize("model_type", sorted(PADDING_OFFSET_POSITIONS))
def test_positions_past_the_padding_id_leave_fewer_tokens_than_rows(model_type):
    config, tables = _position_tables(model_type)
    assert tables, f"{model_type} has no learned position table"
    for table in tables:  # the table's padding row is the config's pad id: positions are numbered past it
        assert table.padding_idx == config.pad_token_id and table.num_embeddings == 40
    # the last token's position is padding_idx + max_context = 39, the table's last row
    assert max_context(config) == 40 - config.pad_token_id - 1 == {"markuplm": 39}.get(model_type, 38)


def test_positions_from_zero_take_every_row():
    config, tables = _position_tables("bert")
    assert [t.padding_idx for t in tables] == [None] and max_context(config) == 40
    roberta = transformers.AutoConfig.for_model("roberta", max_position_embeddings=514)
    assert max_context(roberta) == 512  # what a real RobertaModel takes
