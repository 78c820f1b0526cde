/*
 * test_hf_config.c - config.json of Hugging Face models (issue 43): the
 * folders scripts/hf_reference.py made (both forms of the rope keys),
 * configs shaped like SmolLM2-135M, Llama 3.1, Mistral 7B v0.1, Qwen2.5 and
 * GPT-2 as published, a sliding window shorter than the sequence, and each
 * malformed or unknown key refused with a message naming the file and key.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "test.h"

#include "../src/model/hf_config.h" /* internal to src/model */

#include <cjson/cJSON.h>
#include <unistd.h>

static const char *hf_dir(void)
{
    return getenv("ZR_HF_DATA") != NULL ? getenv("ZR_HF_DATA") : "tests/data/hf";
}

static void test_reference_folders(void)
{
    char path[512];
    zr_hf_config c;
    snprintf(path, sizeof path, "%s/llama_gqa", hf_dir());
    TEST_OK(zr_hf_config_read(&c, path));
    TEST_EQ_INT(c.family, ZR_HF_LLAMA);
    TEST_EQ_INT(c.vocab, 256);
    TEST_EQ_INT(c.hidden, 64);
    TEST_EQ_INT(c.layers, 2);
    TEST_EQ_INT(c.heads, 8);
    TEST_EQ_INT(c.kv_heads, 2);
    TEST_EQ_INT(c.head_dim, 8);
    TEST_EQ_INT(c.intermediate, 136);
    TEST_EQ_INT(c.tied, 0);
    TEST_EQ_INT(c.qkv_bias + c.o_bias + c.mlp_bias, 0);
    TEST_CHECK(c.rope.llama3 && c.rope.factor == 8.0 && c.rope.original_max_pos == 64.0);
    TEST_CHECK(c.rope_theta == 10000.0 && c.norm_eps == 1e-5);
    snprintf(path, sizeof path, "%s/llama_mha_tied/config.json", hf_dir());
    TEST_OK(zr_hf_config_read(&c, path));
    TEST_EQ_INT(c.kv_heads, 4);
    TEST_EQ_INT(c.head_dim, 24);
    TEST_EQ_INT(c.tied, 1);
    TEST_CHECK(!c.rope.llama3 && c.rope_theta == 500000.0 && c.norm_eps == 1e-6);
    snprintf(path, sizeof path, "%s/qwen2", hf_dir());
    TEST_OK(zr_hf_config_read(&c, path));
    TEST_EQ_INT(c.family, ZR_HF_QWEN2);
    TEST_EQ_INT(c.qkv_bias, 1);
    TEST_EQ_INT(c.o_bias + c.mlp_bias, 0);
    TEST_EQ_INT(c.sliding_window, 0);
    TEST_CHECK(c.rope_theta == 1e6 && c.tied);
    TEST_FAILS(zr_hf_config_read(&c, "/nonexistent-zr/config.json"), ZR_ERR_IO,
               "/nonexistent-zr/config.json");
}

/* SmolLM2-135M's config.json as published (keys and values). */
static const char smollm2[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
    "\"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 0, \"hidden_act\": "
    "\"silu\", \"hidden_size\": 576, \"initializer_range\": 0.041666666666666664, "
    "\"intermediate_size\": 1536, \"is_llama_config\": true, \"max_position_embeddings\": 8192, "
    "\"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 9, "
    "\"num_hidden_layers\": 30, \"num_key_value_heads\": 3, \"pretraining_tp\": 1, "
    "\"rms_norm_eps\": 1e-05, \"rope_interleaved\": false, \"rope_scaling\": null, "
    "\"rope_theta\": 100000, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
    "\"transformers_version\": \"4.42.3\", \"transformers.js_config\": {\"kv_cache_dtype\": "
    "{\"q4f16\": \"float16\", \"fp16\": \"float16\"}}, \"use_cache\": true, \"vocab_size\": 49152}";

static void test_published_shapes(void)
{
    zr_hf_config c;
    TEST_OK(zr_hf_config_parse(&c, smollm2, "smollm2.json"));
    TEST_CHECK(c.hidden == 576 && c.heads == 9 && c.kv_heads == 3 && c.head_dim == 64);
    TEST_CHECK(c.layers == 30 && c.intermediate == 1536 && c.vocab == 49152 && c.tied);
    TEST_CHECK(c.rope_theta == 100000.0 && !c.rope.llama3);
    const char *llama31 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": "
        "128256, \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, "
        "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"max_position_embeddings\": "
        "131072, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": "
        "8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "
        "\"tie_word_embeddings\": false, \"bos_token_id\": 128000, \"eos_token_id\": [128001, "
        "128008, 128009]}";
    TEST_OK(zr_hf_config_parse(&c, llama31, "llama31.json"));
    TEST_CHECK(c.rope.llama3 && c.rope.original_max_pos == 8192.0 && c.kv_heads == 8);
    const char *mistral =
        "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", "
        "\"vocab_size\": 32000, \"hidden_size\": 4096, \"intermediate_size\": 14336, "
        "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
        "\"sliding_window\": 4096, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\"}";
    TEST_OK(zr_hf_config_parse(&c, mistral, "mistral.json"));
    TEST_EQ_INT(c.sliding_window, 4096);
    TEST_OK(zr_hf_config_check_seq(&c, "mistral.json", 4096));
    TEST_FAILS(zr_hf_config_check_seq(&c, "mistral.json", 4097), ZR_ERR_INVALID,
               "mistral.json: key \"sliding_window\" (4096) is shorter than");
    const char *gpt2 =
        "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], "
        "\"attn_pdrop\": 0.1, \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": "
        "50256, \"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05, \"model_type\": "
        "\"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, \"n_layer\": 12, "
        "\"n_positions\": 1024, \"resid_pdrop\": 0.1, \"summary_activation\": null, "
        "\"summary_first_dropout\": 0.1, \"summary_proj_to_labels\": true, \"summary_type\": "
        "\"cls_index\", \"summary_use_proj\": true, \"task_specific_params\": "
        "{\"text-generation\": {\"do_sample\": true, \"max_length\": 50}}, \"vocab_size\": 50257}";
    TEST_OK(zr_hf_config_parse(&c, gpt2, "gpt2.json"));
    TEST_CHECK(c.family == ZR_HF_GPT2 && c.hidden == 768 && c.intermediate == 3072 && c.tied);
    TEST_CHECK(c.max_pos == 1024 && c.head_dim == 64 && c.qkv_bias && c.rope_theta == 0.0);
}

/* SmolLM2's config with key set to value (JSON text; NULL: removed). */
static char *mutate(const char *base, const char *key, const char *value)
{
    cJSON *root = cJSON_Parse(base);
    TEST_CHECK(root != NULL);
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (value != NULL) {
        cJSON *v = cJSON_Parse(value);
        TEST_CHECKF(v != NULL, "bad test value %s", value);
        cJSON_AddItemToObject(root, key, v);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static void test_bad_keys(void)
{
    static const struct {
        const char *key, *value, *says;
    } bad[] = {
        {"hidden_size", "\"576\"", "key \"hidden_size\" must be an integer"},
        {"hidden_size", NULL, "key \"hidden_size\" is missing"},
        {"num_key_value_heads", "4", "key \"num_key_value_heads\" (4) must divide"},
        {"num_attention_heads", "4.5", "key \"num_attention_heads\" must be an integer"},
        {"num_hidden_layers", "0", "key \"num_hidden_layers\" must be an integer in [1,"},
        {"intermediate_size", "1540", "key \"intermediate_size\" must be a multiple of 8"},
        {"head_dim", "7", "key \"head_dim\" must be even"},
        {"head_dim", "512", "key \"head_dim\" must be an integer in [2, 256]"},
        {"vocab_size", "300000", "key \"vocab_size\" must be an integer in [1, 262144]"},
        {"vocab_size", "0", "key \"vocab_size\""},
        {"max_position_embeddings", "-5", "key \"max_position_embeddings\""},
        {"rms_norm_eps", "-1", "key \"rms_norm_eps\" must be a positive number"},
        {"rope_theta", "\"big\"", "key \"rope_theta\" must be a positive number"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope type \"yarn\""},
        {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}",
         "key \"rope_scaling\": key \"low_freq_factor\" is missing"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": "
         "4, \"original_max_position_embeddings\": 8192, \"beta_fast\": 32}",
         "does not understand: \"beta_fast\""},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": "
         "1, \"original_max_position_embeddings\": 8192}",
         "\"high_freq_factor\" must exceed"},
        {"rope_scaling", "5", "key \"rope_scaling\" must be an object or null"},
        {"hidden_act", "\"gelu\"", "key \"hidden_act\": zr implements only \"silu\""},
        {"rope_interleaved", "true", "key \"rope_interleaved\": zr implements only false"},
        {"tie_word_embeddings", "1", "key \"tie_word_embeddings\" must be true or false"},
        {"attention_bias", "\"no\"", "key \"attention_bias\" must be true or false"},
        {"partial_rotary_factor", "0.5", "key \"partial_rotary_factor\": zr implements only 1"},
        {"foo_bar", "1", "LlamaForCausalLM with key zr does not understand: \"foo_bar\""},
        {"architectures", "[\"BertForMaskedLM\"]", "architecture \"BertForMaskedLM\" is not one"},
        {"architectures", "\"LlamaForCausalLM\"", "key \"architectures\" must be a list"},
        {"model_type", "\"qwen2\"", "key \"model_type\" is \"qwen2\", but LlamaForCausalLM"},
    };
    zr_hf_config c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = mutate(smollm2, bad[i].key, bad[i].value);
        zr_error_clear();
        zr_status st = zr_hf_config_parse(&c, text, "bad.json");
        const char *msg = zr_error_message();
        TEST_CHECKF(st == ZR_ERR_INVALID && strncmp(msg, "bad.json: ", 10) == 0 &&
                        strstr(msg, bad[i].says) != NULL,
                    "%s = %s: %s \"%s\", expected \"%s\"", bad[i].key,
                    bad[i].value ? bad[i].value : "(removed)", zr_status_str(st), msg, bad[i].says);
        cJSON_free(text);
    }
    printf("  %zu malformed or unknown keys refused, each naming the file and key\n",
           sizeof bad / sizeof bad[0]);
    TEST_FAILS(zr_hf_config_parse(&c, "{\"architectures\": [", "trunc.json"), ZR_ERR_FORMAT,
               "trunc.json: not a JSON object");
    /* the unknown architecture also lists the keys zr does not know */
    TEST_FAILS(
        zr_hf_config_parse(&c, "{\"model_type\": \"bert\", \"type_vocab_size\": 2}", "b.json"),
        ZR_ERR_INVALID,
        "architecture \"bert\" is not one zr trains (LlamaForCausalLM, "
        "MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel); keys zr does not know: "
        "\"type_vocab_size\"");
}

/* Qwen2's biases are fixed; its sliding window applies from max_window_layers on. */
static void test_qwen2_rules(void)
{
    const char *base = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
                       "\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, "
                       "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"sliding_window\": 32, "
                       "\"use_sliding_window\": false, \"max_window_layers\": 2}";
    zr_hf_config c;
    TEST_OK(zr_hf_config_parse(&c, base, "q.json"));
    TEST_EQ_INT(c.sliding_window, 0);
    char *t = mutate(base, "use_sliding_window", "true");
    TEST_OK(zr_hf_config_parse(&c, t, "q.json"));
    TEST_EQ_INT(c.sliding_window, 32);
    TEST_FAILS(zr_hf_config_check_seq(&c, "q.json", 64), ZR_ERR_INVALID, "sliding_window");
    cJSON_free(t);
    t = mutate(base, "layer_types", "[\"full_attention\", \"full_attention\"]");
    TEST_FAILS(zr_hf_config_parse(&c, t, "q.json"), ZR_ERR_INVALID, "key \"layer_types\"");
    cJSON_free(t);
    t = mutate(base, "attention_bias", "true");
    TEST_FAILS(zr_hf_config_parse(&c, t, "q.json"), ZR_ERR_INVALID,
               "key \"attention_bias\": Qwen2ForCausalLM has no such bias");
    cJSON_free(t);
}

/* A bad file in a folder: the message names the folder's config.json. */
static void test_bad_file(void)
{
    char dir[] = "/tmp/zr-test-hfcfg-XXXXXX", path[64];
    TEST_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = mutate(smollm2, "num_key_value_heads", "\"three\"");
    zr_test_write_file(path, text, strlen(text));
    cJSON_free(text);
    zr_hf_config c;
    char want[128];
    snprintf(want, sizeof want, "%s: key \"num_key_value_heads\"", path);
    TEST_FAILS(zr_hf_config_read(&c, dir), ZR_ERR_INVALID, want);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    TEST_RUN(test_reference_folders);
    TEST_RUN(test_published_shapes);
    TEST_RUN(test_bad_keys);
    TEST_RUN(test_qwen2_rules);
    TEST_RUN(test_bad_file);
    return zr_test_finish();
}
