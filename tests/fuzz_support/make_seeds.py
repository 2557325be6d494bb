#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/*/fuzz/corpus/*/seed_*): small valid and
near-valid inputs of each format, so that fuzzing starts from the interesting shapes. Run from the
repository root; the outputs are committed. Inputs of crashes found (crash_*) are committed beside
them by hand and are never rewritten here."""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(folder, name, data):
    d = os.path.join(ROOT, folder)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data=b"", pad=True):
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    out = "tests/model/fuzz/corpus/safetensors_fuzz"
    write(out, "one_f32", safetensors({"w": {"dtype": "F32", "shape": [2, 2],
                                             "data_offsets": [0, 16]}}, bytes(16)))
    write(out, "two_tensors_meta", safetensors({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
        "b": {"dtype": "I32", "shape": [1, 2], "data_offsets": [6, 14]}}, bytes(14)))
    write(out, "fp8_and_scale", safetensors({
        "w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]},
        "w_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [16, 20]}}, bytes(20)))
    write(out, "empty_tensor", safetensors({"e": {"dtype": "F32", "shape": [0, 5],
                                                  "data_offsets": [0, 0]}}))
    write(out, "scalar", safetensors({"s": {"dtype": "I64", "shape": [],
                                            "data_offsets": [0, 8]}}, bytes(8)))
    write(out, "overlap", safetensors({
        "x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "y": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(16)))
    write(out, "truncated", safetensors({"w": {"dtype": "F32", "shape": [8],
                                               "data_offsets": [0, 32]}}, bytes(8)))
    write(out, "huge_dims", safetensors({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0],
                                               "data_offsets": [0, 0]}}))
    write(out, "header_len_too_big", struct.pack("<Q", 1 << 40) + b"{}")
    write(out, "not_object", safetensors([1, 2, 3]))


def config_seeds():
    out = "tests/config/fuzz/corpus/config_fuzz"
    for name in ["v2-tiny", "v3-tiny", "v32-tiny", "v32-tiny-fp8"]:
        with open(os.path.join(ROOT, "tests/data/models", name, "config.json"), "rb") as f:
            write(out, name.replace("-", "_"), f.read())
    with open(os.path.join(ROOT, "models/osprey-arith/config.json"), "rb") as f:
        write(out, "osprey_arith", f.read())
    with open(os.path.join(ROOT, "tests/data/models/v3-tiny/config.json")) as f:
        c = json.load(f)
    c["rope_scaling"] = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    write(out, "v3_yarn", json.dumps(c))
    c["eos_token_id"] = [1, 2]
    c["q_lora_rank"] = None
    write(out, "v3_eos_list_no_q_lora", json.dumps(c))


def openai_seeds():
    out = "tests/server/fuzz/corpus/openai_request_fuzz"
    bodies = {
        "chat_min": {"messages": [{"role": "user", "content": "2+2="}]},
        "chat_full": {"model": "osprey-arith", "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="},
            {"role": "assistant", "content": "2"}, {"role": "user", "content": [
                {"type": "text", "text": "3+4="}]}],
            "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "n": 2,
            "seed": 7, "stop": ["\n", "="], "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.1, "logprobs": True, "top_logprobs": 3, "stream": True,
            "stream_options": {"include_usage": True}, "min_tokens": 1,
            "stop_token_ids": [1], "chat_template_kwargs": {"thinking": True}},
        "chat_max_completion_tokens": {"messages": [{"role": "developer", "content": "x"},
                                                    {"role": "user", "content": "5*5="}],
                                       "max_completion_tokens": 100},
        "completion_text": {"prompt": "12+34=", "max_tokens": 4},
        "completion_ids": {"prompt": [3, 4, 5, 6], "max_tokens": 120, "logprobs": 2,
                           "echo": True},
        "completion_batch": {"prompt": ["1+1=", "2+2="], "n": 3, "best_of": 3,
                             "temperature": 0, "ignore_eos": True},
        "completion_id_lists": {"prompt": [[3, 4], [5, 6, 7]], "seed": -1,
                                "stop": "=", "skip_special_tokens": True},
        "completion_bad_types": {"prompt": "x", "max_tokens": "8", "n": 0.5, "top_k": 1e9},
        "completion_big_numbers": {"prompt": "x", "max_tokens": 9223372036854775807,
                                   "temperature": 1e308, "seed": 18446744073709551615},
    }
    for name, b in bodies.items():
        write(out, name, json.dumps(b))
    write(out, "not_json", b'{"prompt": "1+1=", ')
    write(out, "bad_utf8", b'{"prompt": "\xff\xfe"}')


def chat_seeds():
    out = "tests/tokenizer/fuzz/corpus/chat_fuzz"
    # mode byte: format (bits 0-1), thinking (4), generation prompt (8), JSON (16)
    msgs = "\x00be brief\x01\x01hi <think>\x01\x02</think>hello\x01\x01again"
    for fmt in range(3):
        write(out, "split_fmt%d" % fmt, bytes([fmt | 8]) + msgs.encode())
        write(out, "split_fmt%d_thinking" % fmt, bytes([fmt | 4 | 8]) + msgs.encode())
    j = json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "ü 你好"},
                    {"role": "assistant", "content": "<think>r</think>a"},
                    {"role": "user", "content": None}], ensure_ascii=False)
    write(out, "json_v31", bytes([1 | 8 | 16]) + j.encode())
    write(out, "json_bad_role", bytes([16]) + json.dumps([{"role": "tool", "content": "x"}]).encode())
    write(out, "invalid_utf8", bytes([9]) + b"\x01\xc3(")
    write(out, "special_text", bytes([8]) + "\x01<｜User｜><｜Assistant｜><｜end▁of▁sentence｜>".encode())


if __name__ == "__main__":
    safetensors_seeds()
    config_seeds()
    openai_seeds()
    chat_seeds()
