"""The KV cache handed to and read from a transformers model by the name its version uses."""

import warnings

import pytest

from simlab.models.kv_cache import cache_kwargs, cache_of

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


class NewNames:  # transformers 5: forward(..., cache=...), outputs hold "cache"
    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None):
        return {"logits": input_ids, "cache": cache}


class OldNames:  # transformers 4: forward(..., past_key_values=...), outputs hold "past_key_values"
    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
        return {"logits": input_ids, "past_key_values": past_key_values}


@pytest.mark.parametrize("model", [NewNames(), OldNames()])
def test_the_cache_goes_in_and_comes_back_by_the_models_own_name(model):
    kv = object()
    out = model.forward(1, **cache_kwargs(model, kv))
    assert cache_of(out) is kv


def test_a_real_model_decodes_on_its_own_cache_without_a_deprecation_warning():
    # a tiny randomly initialised Llama (mechanics only): prefill, then one token fed on the
    # returned cache gives the logits a forward over the whole sequence gives, and no
    # FutureWarning is raised on the way
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[3, 14, 15, 9, 2]])
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("error", FutureWarning)
        prefix = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(input_ids=ids[:, -1:], **cache_kwargs(model, cache_of(prefix)), use_cache=True)
        whole = model(input_ids=ids)
    torch.testing.assert_close(step.logits[0, -1], whole.logits[0, -1])
