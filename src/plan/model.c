/*
 * model.c - the model the planner plans: the run's, as zr train builds it
 * (trainer_setup.c's model_shape). Where zr.model.init is a Hugging Face
 * folder its config.json gives the shape (the Llama family: kv heads, head
 * size, SwiGLU width, tied or not) and the zr.model keys follow it; else the
 * keys give a GPT-2. The probe, its reference steps, the cost model, the
 * calibration and the planner all take their zr_gpt_config from here.
 */
#include "zr/plan.h"

#include <sys/stat.h>

static int init_is_hf(const zr_train_config *cfg)
{
    struct stat sb;
    return cfg->init_path[0] != '\0' && stat(cfg->init_path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

zr_status zr_plan_adopt_model(zr_train_config *cfg)
{
    if (!init_is_hf(cfg)) {
        return ZR_OK;
    }
    zr_gpt_config fc;
    ZR_CHECK(zr_gpt_config_read_hf(cfg->init_path, &fc));
    if (!(cfg->given & ZR_GIVEN_SEQ_LEN) && cfg->seq_len > fc.max_t) {
        cfg->seq_len = fc.max_t; /* as zr train does: the folder's positions */
    }
    return zr_config_adopt_model(cfg, &fc, cfg->init_path);
}

zr_status zr_plan_model(const zr_train_config *cfg, int vocab, zr_gpt_config *out)
{
    if (!init_is_hf(cfg)) {
        *out = (zr_gpt_config){cfg->max_seq_len, vocab,      (int)zr_round_up((size_t)vocab, 128),
                               cfg->layers,      cfg->heads, cfg->channels};
        return ZR_OK;
    }
    ZR_CHECK(zr_gpt_config_read_hf(cfg->init_path, out));
    if (vocab != out->vocab) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the data's vocabulary is %d tokens, but the model folder %s (zr.model.init) has "
                "%d; plan it on data tokenised for it, or set zr.model.vocab_size to %d",
                vocab, cfg->init_path, out->vocab, out->vocab);
    }
    /* the depth is the configuration's: the calibration prices the probe's shallower model */
    out->layers = out->llama.layers = cfg->layers;
    return zr_gpt_config_check(out);
}
