"""hub/convert_fairseq.py against an independent re-computation of the authors' fairseq model.

No trained checkpoint was ever published, so the test builds random checkpoints in the fork's layout
(argparse `args` + `model` state dict, names from the notes in /work/shared/notes and the fork's
`ode_transformer` architecture) and re-computes the reference equations with plain torch ops from the fairseq
tensors: in_proj attention with Shaw relative keys, the pre-norm layer L(x) = h + FFN(LN1(h)) with
h = x + SAN(LN0(x)), the RK2/RK4 stage combinations with F = L, DLCL history, the final LayerNorm, and
sqrt(d) * embedding + sinusoidal positions starting at padding_idx + 1.
"""

from __future__ import annotations

import argparse
import fractions
import math
import os

import pytest
import torch
import torch.nn.functional as nnf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ode_transformer.hub.convert_fairseq import (  # noqa: E402
    FairseqCheckpointError,
    convert_fairseq_checkpoint,
    load_fairseq_checkpoint,
    main,
)

D, HEADS, FFN, K, VOCAB, PAD = 16, 2, 24, 3, 40, 1
ENC_LAYERS, DEC_LAYERS = 3, 2


def make_args(calculate_num: int, rk_type: str) -> argparse.Namespace:
    return argparse.Namespace(
        arch="ode_transformer_t2t_wmt_en_de",
        encoder_embed_dim=D,
        decoder_embed_dim=D,
        encoder_layers=ENC_LAYERS,
        decoder_layers=DEC_LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_embed_dim=FFN,
        decoder_ffn_embed_dim=FFN,
        encoder_normalize_before=True,
        decoder_normalize_before=True,
        encoder_learned_pos=False,
        decoder_learned_pos=False,
        no_token_positional_embeddings=False,
        max_source_positions=64,
        max_target_positions=64,
        max_relative_length=K,
        k_only=True,
        encoder_history_type="learnable_dense",
        decoder_history_type="learnable_dense",
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
        enc_calculate_num=calculate_num,
        rk_type=rk_type,
        dropout=0.1,
        attention_dropout=0.1,
        relu_dropout=0.1,
        label_smoothing=0.1,
    )


def make_state(calculate_num: int, rk_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    def norm(prefix):
        return {f"{prefix}.weight": 1 + rand(D, scale=0.1), f"{prefix}.bias": rand(D, scale=0.1)}

    def history(prefix, layers):
        w = torch.rand(layers + 1, layers + 1, generator=g).tril() + 0.1
        out = {f"{prefix}.history.weight": (w / w.sum(1, keepdim=True)).tril()}
        for i in range(layers):
            out |= norm(f"{prefix}.history.layer_norms.{i}")
        return out

    def attention(prefix, relative):
        out = {
            f"{prefix}.in_proj_weight": rand(3 * D, D),
            f"{prefix}.in_proj_bias": rand(3 * D, scale=0.1),
            f"{prefix}.out_proj.weight": rand(D, D),
            f"{prefix}.out_proj.bias": rand(D, scale=0.1),
        }
        if relative:
            out[f"{prefix}.relative_position_keys"] = rand(2 * K + 1, D // HEADS, scale=0.5)
        return out

    def ffn(prefix):
        return {
            f"{prefix}.fc1.weight": rand(FFN, D),
            f"{prefix}.fc1.bias": rand(FFN, scale=0.1),
            f"{prefix}.fc2.weight": rand(D, FFN),
            f"{prefix}.fc2.bias": rand(D, scale=0.1),
        }

    emb = rand(VOCAB, D, scale=D**-0.5)
    emb[PAD] = 0
    state = {
        "encoder.version": torch.tensor([2.0]),
        "decoder.version": torch.tensor([2.0]),
        "encoder.embed_tokens.weight": emb,
        "decoder.embed_tokens.weight": emb,
        "encoder.embed_positions._float_tensor": torch.zeros(1),
        "decoder.embed_positions._float_tensor": torch.zeros(1),
    }
    state |= history("encoder", ENC_LAYERS) | history("decoder", DEC_LAYERS)
    state |= norm("encoder.layer_norm") | norm("decoder.layer_norm")
    for i in range(ENC_LAYERS):
        p = f"encoder.layers.{i}"
        state |= attention(f"{p}.self_attn", True) | ffn(p)
        state |= norm(f"{p}.layer_norms.0") | norm(f"{p}.layer_norms.1")
    for i in range(DEC_LAYERS):
        p = f"decoder.layers.{i}"
        state |= attention(f"{p}.self_attn", True) | attention(f"{p}.encoder_attn", False) | ffn(p)
        state |= norm(f"{p}.self_attn_layer_norm") | norm(f"{p}.encoder_attn_layer_norm")
        state |= norm(f"{p}.final_layer_norm")
    if calculate_num == 2 and rk_type == "learnable":
        state["encoder.gate_linear.weight"] = rand(1, 2 * D, scale=0.5)
        state["encoder.gate_linear.bias"] = rand(1, scale=0.5)
    if calculate_num == 2 and rk_type == "initialization":
        state["encoder.alpha"] = 1 + rand(2, scale=0.3)
    return state


def make_checkpoint(calculate_num: int, rk_type: str) -> dict:
    return {
        "args": make_args(calculate_num, rk_type),
        "model": make_state(calculate_num, rk_type),
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "num_updates": 10}],
        "last_optimizer_state": {},
        "extra_state": {"epoch": 1},
    }


# ----------------------------------------------------------------------------------------------------------
# The reference equations, from the fairseq tensors (batch-first)
# ----------------------------------------------------------------------------------------------------------


def ref_sinusoidal(num_embeddings: int, dim: int, padding_idx: int) -> torch.Tensor:
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    angles = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    table[padding_idx] = 0
    return table


def ref_embed(s, tokens):
    length = tokens.shape[1]
    positions = torch.arange(PAD + 1, PAD + 1 + length)  # fairseq make_positions for unpadded rows
    table = ref_sinusoidal(64 + PAD + 1, D, PAD)
    return math.sqrt(D) * s["encoder.embed_tokens.weight"][tokens] + table[positions][None]


def ref_ln(s, prefix, x):
    return nnf.layer_norm(x, (D,), s[f"{prefix}.weight"], s[f"{prefix}.bias"], 1e-5)


def ref_attention(s, prefix, query, memory, relative: bool, causal: bool, key_padding=None):
    """fairseq MultiheadAttention with in_proj (q, k, v stacked); memory=None is self-attention."""
    memory = query if memory is None else memory
    w, b = s[f"{prefix}.in_proj_weight"], s[f"{prefix}.in_proj_bias"]
    q = (query @ w[:D].T + b[:D]) * (D // HEADS) ** -0.5
    k = memory @ w[D : 2 * D].T + b[D : 2 * D]
    v = memory @ w[2 * D :].T + b[2 * D :]
    batch, tq, tk = query.shape[0], query.shape[1], memory.shape[1]

    def heads(x):
        return x.view(batch, x.shape[1], HEADS, D // HEADS).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    logits = q @ k.transpose(-1, -2)
    if relative:
        distance = torch.arange(tk)[None, :] - torch.arange(tq)[:, None]
        table = s[f"{prefix}.relative_position_keys"][distance.clamp(-K, K) + K]  # (tq, tk, head_dim)
        logits = logits + torch.einsum("bhqd,qkd->bhqk", q, table)
    if causal:
        logits = logits.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(1), float("-inf"))
    if key_padding is not None:
        logits = logits.masked_fill(key_padding[:, None, None, :], float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, tq, D)
    return out @ s[f"{prefix}.out_proj.weight"].T + s[f"{prefix}.out_proj.bias"]


def ref_ffn(s, prefix, x):
    hidden = torch.relu(x @ s[f"{prefix}.fc1.weight"].T + s[f"{prefix}.fc1.bias"])
    return hidden @ s[f"{prefix}.fc2.weight"].T + s[f"{prefix}.fc2.bias"]


def ref_encoder_layer(s, i, x, key_padding=None):
    p = f"encoder.layers.{i}"
    h = x + ref_attention(
        s, f"{p}.self_attn", ref_ln(s, f"{p}.layer_norms.0", x), None, True, False, key_padding
    )
    return h + ref_ffn(s, p, ref_ln(s, f"{p}.layer_norms.1", h))


def ref_history_read(s, side, states):
    weights = s[f"{side}.history.weight"][len(states) - 1, : len(states)]
    return sum(w * state for w, state in zip(weights, states))


def ref_encoder(s, calculate_num, rk_type, tokens, key_padding=None):
    x = ref_embed(s, tokens)
    states = [x]
    for i in range(ENC_LAYERS):
        y = ref_history_read(s, "encoder", states)
        layer = lambda z, i=i: ref_encoder_layer(s, i, z, key_padding)  # noqa: E731
        if calculate_num == 4:
            f1 = layer(y)
            f2 = layer(y + f1 / 2)
            f3 = layer(y + f2 / 2)
            f4 = layer(y + f3)
            out = y + (f1 + 2 * f2 + 2 * f3 + f4) / 6
        else:
            f1 = layer(y)
            f2 = layer(y + f1)
            if rk_type == "standard":
                out = y + (f1 + f2) / 2
            elif rk_type == "initialization":
                a = s["encoder.alpha"]
                out = y + a[0] * f1 + a[1] * f2
            else:
                gate = torch.sigmoid(
                    torch.cat([f1, f2], -1) @ s["encoder.gate_linear.weight"].T
                    + s["encoder.gate_linear.bias"]
                )
                out = y + gate * f1 + (1 - gate) * f2
        states.append(ref_ln(s, f"encoder.history.layer_norms.{i}", out))
    return ref_ln(s, "encoder.layer_norm", ref_history_read(s, "encoder", states))


def ref_decoder(s, prev_tokens, encoder_out):
    x = ref_embed(s, prev_tokens)
    states = [x]
    for i in range(DEC_LAYERS):
        p = f"decoder.layers.{i}"
        x = ref_history_read(s, "decoder", states)
        x = x + ref_attention(
            s, f"{p}.self_attn", ref_ln(s, f"{p}.self_attn_layer_norm", x), None, True, True
        )
        x = x + ref_attention(
            s, f"{p}.encoder_attn", ref_ln(s, f"{p}.encoder_attn_layer_norm", x), encoder_out, False, False
        )
        x = x + ref_ffn(s, p, ref_ln(s, f"{p}.final_layer_norm", x))
        states.append(ref_ln(s, f"decoder.history.layer_norms.{i}", x))
    hidden = ref_ln(s, "decoder.layer_norm", ref_history_read(s, "decoder", states))
    return hidden, hidden @ s["decoder.embed_tokens.weight"].T


# ----------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------

CASES = [
    (2, "learnable", "gated"),
    (2, "standard", "tableau"),
    (2, "initialization", "learnable"),
    (4, "standard", "tableau"),
]


@pytest.mark.parametrize(("calculate_num", "rk_type", "coefficients"), CASES)
def test_converted_model_matches_reference(tmp_path, calculate_num, rk_type, coefficients):
    checkpoint = make_checkpoint(calculate_num, rk_type)
    path = tmp_path / "checkpoint_last.pt"
    torch.save(checkpoint, path)
    model = convert_fairseq_checkpoint(path, tmp_path / "hf")
    config = model.config
    assert config.encoder_ode_method == ("rk4" if calculate_num == 4 else "rk2")
    assert config.encoder_ode_coefficients == coefficients
    assert config.ode_function_includes_residual and config.ode_coefficient_scope == "stack"
    assert config.position_offset == PAD + 1 and config.max_relative_position == K
    assert (tmp_path / "hf" / "model.safetensors").is_file()

    s = checkpoint["model"]
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, VOCAB, (2, 7), generator=g)
    prev = torch.cat([torch.full((2, 1), 2), torch.randint(3, VOCAB, (2, 5), generator=g)], dim=1)
    with torch.no_grad():
        expected_enc = ref_encoder(s, calculate_num, rk_type, src)
        expected_hidden, expected_logits = ref_decoder(s, prev, expected_enc)
        encoder_out = model.get_encoder()(input_ids=src).last_hidden_state
        outputs = model(input_ids=src, decoder_input_ids=prev, output_hidden_states=False)
        decoder_out = model.model(input_ids=src, decoder_input_ids=prev).last_hidden_state
    torch.testing.assert_close(encoder_out, expected_enc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decoder_out, expected_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs.logits, expected_logits, atol=1e-5, rtol=1e-5)


def test_right_padded_source_matches_reference(tmp_path):
    checkpoint = make_checkpoint(2, "learnable")
    model = convert_fairseq_checkpoint(checkpoint)
    src = torch.tensor([[5, 6, 7, 8, 9, 2], [5, 6, 7, 2, PAD, PAD]])
    mask = (src != PAD).long()
    with torch.no_grad():
        expected = ref_encoder(checkpoint["model"], 2, "learnable", src, key_padding=src.eq(PAD))
        got = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    # fairseq's positions skip padding: with right padding they coincide with ours on the real tokens.
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)


def test_malformed_checkpoint_names_missing_keys():
    checkpoint = make_checkpoint(2, "learnable")
    del checkpoint["model"]["encoder.layers.1.fc2.weight"]
    del checkpoint["model"]["decoder.history.layer_norms.0.bias"]
    with pytest.raises(FairseqCheckpointError) as info:
        convert_fairseq_checkpoint(checkpoint)
    message = str(info.value)
    assert "model.encoder.layers.1.ffn.fc2.weight" in message
    assert "model.decoder.connections.layer_norms.0.bias" in message


def test_unknown_keys_and_mismatched_args_are_reported():
    checkpoint = make_checkpoint(2, "learnable")
    checkpoint["model"]["encoder.layers.0.extra_gate.weight"] = torch.zeros(3)
    with pytest.raises(FairseqCheckpointError, match="encoder.layers.0.extra_gate.weight"):
        convert_fairseq_checkpoint(checkpoint)
    checkpoint = make_checkpoint(2, "learnable")
    checkpoint["args"].rk_type = "standard"  # the state dict still holds the gate
    with pytest.raises(FairseqCheckpointError, match="gate_linear"):
        convert_fairseq_checkpoint(checkpoint)
    checkpoint = make_checkpoint(2, "learnable")
    checkpoint["args"].encoder_normalize_before = False
    with pytest.raises(FairseqCheckpointError, match="post-norm"):
        convert_fairseq_checkpoint(checkpoint)


def test_foreign_checkpoint_is_rejected(tmp_path):
    foreign = {"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}
    with pytest.raises(FairseqCheckpointError, match=r"not a fairseq checkpoint.*\['args', 'model'\]"):
        convert_fairseq_checkpoint(foreign)
    path = tmp_path / "foreign.pt"
    torch.save({"args": argparse.Namespace(), "model": foreign}, path)
    with pytest.raises(FairseqCheckpointError, match="missing keys"):
        convert_fairseq_checkpoint(path)


def test_pickle_flag(tmp_path, refused):
    # args Namespace only: loads safely (weights_only=True with argparse.Namespace allow-listed).
    safe = tmp_path / "safe.pt"
    torch.save(make_checkpoint(2, "standard"), safe)
    assert isinstance(load_fairseq_checkpoint(safe)["args"], argparse.Namespace)
    # Any other Python object needs full unpickling: a clear error naming the flag, then the flag works.
    unsafe = tmp_path / "unsafe.pt"
    checkpoint = make_checkpoint(2, "standard")
    checkpoint["extra_state"]["best"] = fractions.Fraction(1, 3)
    torch.save(checkpoint, unsafe)
    with pytest.raises(FairseqCheckpointError, match="--trust-pickle"):
        load_fairseq_checkpoint(unsafe)
    error = refused(main, [str(unsafe), str(tmp_path / "out")])
    assert (
        error.startswith("python -m ode_transformer.hub.convert_fairseq: error: ")
        and "--trust-pickle" in error
    )
    main([str(unsafe), str(tmp_path / "out"), "--trust-pickle"])
    assert (tmp_path / "out" / "config.json").is_file()


def test_occupied_output_folder_is_refused_unless_overwrite(tmp_path, refused):
    """A stale tokenizer.json or card left in OUT_DIR would sit beside the new weights and describe another
    model: refused (before the checkpoint is read), as ode_transformer.hub.export does, and --overwrite clears it."""
    checkpoint = tmp_path / "checkpoint_best.pt"
    torch.save(make_checkpoint(2, "standard"), checkpoint)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")
    with pytest.raises(FileExistsError, match=r"hf already holds files \(tokenizer\.json.*--overwrite"):
        convert_fairseq_checkpoint(checkpoint, out)
    with pytest.raises(FileExistsError, match="--overwrite"):  # refused before the checkpoint is looked at
        convert_fairseq_checkpoint(tmp_path / "missing.pt", out)
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]
    error = refused(main, [str(checkpoint), str(out)])
    assert (
        error.startswith("python -m ode_transformer.hub.convert_fairseq: error: ") and "--overwrite" in error
    )
    main([str(checkpoint), str(out), "--overwrite"])
    assert not (out / "tokenizer.json").exists() and (out / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file; OUT_DIR must be a folder"):
        convert_fairseq_checkpoint(checkpoint, tmp_path / "file")


def test_what_is_no_checkpoint_file_is_named(tmp_path, refused):
    """A folder, a text file, an empty or truncated file: each refused as what it is, with --trust-pickle or
    without and never advising it; the command exits 2 with no traceback, a text file under --trust-pickle
    included (not a raw UnpicklingError)."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save(make_checkpoint(2, "standard"), run / "checkpoint_best.pt")
    with pytest.raises(FairseqCheckpointError, match=r"run is a folder.*checkpoint file \(\.pt\).*best\.pt"):
        load_fairseq_checkpoint(run)
    with pytest.raises(FileNotFoundError, match="missing.pt does not exist"):
        load_fairseq_checkpoint(tmp_path / "missing.pt")
    text = tmp_path / "train.log"
    text.write_text("hello, this is a training log\n")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((run / "checkpoint_best.pt").read_bytes()[:300])
    for path, problem in ((text, "starts with b'hello, t'"), (empty, "empty"), (truncated, "truncated")):
        for trust_pickle in (False, True):
            with pytest.raises(FairseqCheckpointError) as info:
                load_fairseq_checkpoint(path, trust_pickle=trust_pickle)
            message = str(info.value)
            assert f"{path} is not a fairseq/torch checkpoint" in message and problem in message
            assert "checkpoint*.pt" in message and "--trust-pickle" not in message
    for argv in ([str(text)], [str(text), "--trust-pickle"], [str(run)], [str(tmp_path / "missing.pt")]):
        error = refused(main, [argv[0], str(tmp_path / f"out{len(argv)}"), *argv[1:]])
        assert (
            error.startswith("python -m ode_transformer.hub.convert_fairseq: error: ")
            and "Traceback" not in error
        )
