// simlab-llama-trace: record one prompt's trace rows with llama.cpp's own numerics.
//
// Built by simlab/engines/llama_cpp.py against the same vendored tree, libraries and compile
// flags as llama-speculative-simple, and given the same command-line arguments (after "--"),
// so both models are loaded into contexts configured exactly as that binary configures them
// (threads, batch sizes, KV types, flash attention). It walks the target's greedy path one
// token at a time, stepping the draft in lockstep on the same prefix, and writes tab-separated
// rows to OUT (simlab/engines/llama_record.py turns them into a simlab trace):
//
//   H  prompt_len  n_tokens  stop                 the prompt (prompt_len = prompt tokens - 1)
//   P  pos target draft conf entropy q_target p_target p_draft accept_prob
//   R  pos step token conf entropy                the draft's own continuation after a miss
//   L  op k context_len repeat seconds batch      step latencies (see the end of main)
//
// Usage: simlab-llama-trace OUT ROLLOUT_LEN KS CONTEXTS REPEATS BATCH -- <llama-speculative-simple arguments>
// (KS and CONTEXTS comma-separated). BATCH = 1: the walk above, then the single-sequence
// latencies (batch 1). BATCH = B > 1: no walk and no H, P or R rows, only the latencies of B
// sequences decoded together, as llama-server decodes its B parallel slots (its arguments must
// then hold -np B, and a -c of B times the cells one sequence needs: with an explicit -np the
// KV cache is not unified, each sequence gets n_ctx / B cells, as in llama-server).
//
// Position 0 is the prompt's last token: llama-speculative-simple prefills all prompt tokens
// but the last and drafts from the last one, so in simlab's terms (position 0 comes from the
// prefill) the prompt is one token shorter and its last token is position 0.
//
// The draft's confidence is what llama.cpp's draft sampler reports: the top-1 probability of
// a softmax over the 10 largest logits (common/speculative.cpp: a top-k 10 sampler, then
// cur_p->data[0].p), because that is the number its --draft-p-min is compared with. The
// entropy and every other probability are over the whole vocabulary.

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "sampling.h"
#include "speculative.h"

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

const int DRAFT_TOP_K = 10;  // common_speculative_impl_draft_simple's sampler: top_k = 10

struct Dist {
    int argmax = 0;
    float conf_top_k = 1.0f;  // top-1 probability over the DRAFT_TOP_K largest logits
    float entropy = 0.0f;
    std::vector<float> p;  // softmax over the vocabulary
};

// The logits a sampler of common/sampling.cpp starts from: the model's suppress tokens (a GGUF
// key, absent from most models) get -inf there, as common_sampler_init's logit bias does.
Dist dist_of(const float * raw, const llama_vocab * vocab) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<float> biased(raw, raw + n_vocab);
    int32_t n_suppress = 0;
    const llama_token * suppress = llama_vocab_get_suppress_tokens(vocab, &n_suppress);
    for (int32_t i = 0; i < n_suppress; ++i) {
        biased[suppress[i]] = -INFINITY;
    }
    const float * logits = biased.data();
    Dist d;
    d.p.resize(n_vocab);
    // the first maximum, as llama.cpp's greedy (temperature 0) sampler keeps it
    for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[d.argmax]) {
            d.argmax = i;
        }
    }
    const float max_l = logits[d.argmax];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        d.p[i] = std::exp(logits[i] - max_l);
        sum += d.p[i];
    }
    double ent = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        d.p[i] = (float) (d.p[i] / sum);
        if (d.p[i] > 0.0f) {  // 0 for suppressed tokens
            ent -= d.p[i] * std::log((double) d.p[i]);
        }
    }
    d.entropy = (float) ent;
    std::vector<float> top(logits, logits + n_vocab);
    const int k = std::min(DRAFT_TOP_K, n_vocab);
    std::partial_sort(top.begin(), top.begin() + k, top.end(), std::greater<float>());
    double top_sum = 0.0;
    for (int i = 0; i < k; ++i) {
        top_sum += std::exp(top[i] - max_l);
    }
    d.conf_top_k = (float) (1.0 / top_sum);
    return d;
}

// One forward of `tokens` at positions pos0.. on each of the sequences seq0 .. seq0 + n_seq - 1
// (one batch, each sequence's tokens together, as llama-server lays out its slots); all
// positions output logits when `all_logits`, else only the batch's last. Returns the seconds it took.
double forward(llama_context * ctx, const std::vector<llama_token> & tokens, int pos0, bool all_logits,
               int seq0 = 0, int n_seq = 1) {
    common_batch batch(ctx);
    for (int s = seq0; s < seq0 + n_seq; ++s) {
        for (size_t i = 0; i < tokens.size(); ++i) {
            const bool last = s + 1 == seq0 + n_seq && i + 1 == tokens.size();
            batch.add(tokens[i], pos0 + (int) i, s, all_logits || last);
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
        fprintf(stderr, "simlab-llama-trace: llama_process failed at position %d\n", pos0);
        std::exit(1);
    }
    llama_synchronize(ctx);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A prompt's prefill as llama-server runs it: one forward of `tokens` with only the last
// position's logits, sampled by `smpl` (the target samples the request's first token there; the
// draft, which only keeps its cache in step, samples nothing: nullptr). Returns the seconds.
double timed_prefill(llama_context * ctx, const std::vector<llama_token> & tokens, int pos0, common_sampler * smpl) {
    const auto t0 = std::chrono::steady_clock::now();
    forward(ctx, tokens, pos0, false);
    if (smpl != nullptr) {
        common_sampler_sample(smpl, ctx, (int) tokens.size() - 1);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int> int_list(const std::string & s) {
    std::vector<int> out;
    size_t start = 0;
    while (start < s.size()) {
        size_t end = s.find(',', start);
        if (end == std::string::npos) {
            end = s.size();
        }
        out.push_back(std::atoi(s.substr(start, end - start).c_str()));
        start = end + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    if (argc < 8 || std::string(argv[7]) != "--") {
        fprintf(stderr, "usage: %s OUT ROLLOUT_LEN KS CONTEXTS REPEATS BATCH -- <llama-speculative-simple arguments>\n",
                argv[0]);
        return 2;
    }
    FILE * out = fopen(argv[1], "w");
    if (out == nullptr) {
        fprintf(stderr, "simlab-llama-trace: cannot write %s\n", argv[1]);
        return 2;
    }
    const int rollout_len = std::atoi(argv[2]);
    const std::vector<int> ks = int_list(argv[3]);
    const std::vector<int> contexts = int_list(argv[4]);
    const int repeats = std::atoi(argv[5]);
    const int n_batch_seq = std::atoi(argv[6]);  // BATCH: sequences decoded together

    // the same initialisation as examples/speculative-simple/speculative-simple.cpp
    std::vector<char *> llama_argv = {argv[0]};
    for (int i = 8; i < argc; ++i) {
        llama_argv.push_back(argv[i]);
    }
    common_params params;
    common_init();
    if (!common_params_parse((int) llama_argv.size(), llama_argv.data(), params, LLAMA_EXAMPLE_SPECULATIVE)) {
        return 2;
    }
    if (n_batch_seq < 1 || (n_batch_seq > 1 && params.n_parallel != n_batch_seq)) {
        fprintf(stderr, "simlab-llama-trace: BATCH %d needs -np %d among the arguments (got -np %d)\n", n_batch_seq,
                n_batch_seq, params.n_parallel);
        return 2;
    }
    // as speculative-simple sizes its output buffers, but large enough for the k-token probes
    // (the buffers' size changes no computation)
    const int max_k = ks.empty() ? 1 : *std::max_element(ks.begin(), ks.end());
    const auto output_limits = common_speculative_get_output_limits(
            params.n_batch, params.n_parallel, std::max(common_speculative_n_max(&params.speculative), max_k - 1));
    params.n_outputs_max = output_limits.total;
    params.n_outputs_max_per_seq = output_limits.per_seq;
    llama_backend_init();
    llama_numa_init(params.numa);
    auto llama_init_tgt = common_init_from_params(params);
    llama_model * model_tgt = llama_init_tgt->model();
    llama_context * ctx_tgt = llama_init_tgt->context();
    common_params params_dft = common_base_params_to_speculative(params);
    auto spec_init = common_speculative_init_from_params(params_dft, model_tgt, ctx_tgt);
    llama_context * ctx_dft = spec_init->context();
    if (ctx_tgt == nullptr || ctx_dft == nullptr) {
        fprintf(stderr, "simlab-llama-trace: could not load the target and the draft model\n");
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model_tgt);
    const llama_vocab * vocab_dft = llama_model_get_vocab(llama_get_model(ctx_dft));

    const std::vector<llama_token> inp = common_tokenize(ctx_tgt, params.prompt, true, true);
    if (n_batch_seq == 1) {  // a batch probe (BATCH > 1) times forwards only
        const int prompt_len = (int) inp.size() - 1;
        const std::vector<llama_token> prefix(inp.begin(), inp.end() - 1);
        forward(ctx_tgt, prefix, 0, false);
        forward(ctx_dft, prefix, 0, false);

        // the target's greedy path; position 0 is the prompt's last token
        llama_token cur = inp.back();
        int n_tokens = 1;
        std::string stop = "length";
        fprintf(out, "P\t0\t%d\t%d\t1\t0\t1\t1\t1\t1\n", cur, cur);
        for (int pos = 1; pos <= params.n_predict; ++pos) {
            const int at = prompt_len + pos - 1;  // where `cur` goes in both caches
            forward(ctx_tgt, {cur}, at, true);
            forward(ctx_dft, {cur}, at, true);
            const Dist t = dist_of(llama_get_logits_ith(ctx_tgt, 0), vocab);
            const Dist d = dist_of(llama_get_logits_ith(ctx_dft, 0), vocab_dft);
            double accept = 0.0;
            for (size_t i = 0; i < std::min(t.p.size(), d.p.size()); ++i) {
                accept += std::min(t.p[i], d.p[i]);
            }
            fprintf(out, "P\t%d\t%d\t%d\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\n", pos, t.argmax, d.argmax, d.conf_top_k,
                    d.entropy, t.argmax < (int) d.p.size() ? d.p[t.argmax] : 0.0f, t.p[t.argmax],
                    d.argmax < (int) t.p.size() ? t.p[d.argmax] : 0.0f, accept);
            if (d.argmax != t.argmax && rollout_len > 0) {
                llama_token own = d.argmax;
                for (int step = 1; step <= rollout_len; ++step) {
                    forward(ctx_dft, {own}, at + step, true);
                    const Dist r = dist_of(llama_get_logits_ith(ctx_dft, 0), vocab_dft);
                    fprintf(out, "R\t%d\t%d\t%d\t%.9g\t%.9g\n", pos, step, r.argmax, r.conf_top_k, r.entropy);
                    own = r.argmax;
                }
                llama_memory_seq_rm(llama_get_memory(ctx_dft), 0, at + 1, -1);
            }
            cur = t.argmax;
            n_tokens = pos + 1;
            if (llama_vocab_is_eog(vocab, cur)) {
                stop = "eos";
                break;
            }
        }
        fprintf(out, "H\t%d\t%d\t%s\n", prompt_len, n_tokens, stop.c_str());
    }

    // Latencies of the steps llama-speculative-simple takes, each with the sampling it does:
    // - draft_step: the draft's one-token forward and its top-k 10 sampler (draft() in
    //   common/speculative.cpp);
    // - target_forward of k tokens: the target's forward of [id_last, drafts...] with every
    //   position's logits, the target sampler run on each (common_sampler_sample_and_accept_n),
    //   and the draft's forward of the same batch that keeps its cache in step
    //   (common_speculative_process) -- speculative-simple runs all three for every verification.
    // - target_step: the target's one-token forward and its sampler alone, the step of llama.cpp's
    //   plain decoding (a llama-server slot without a draft model): the autoregressive baseline,
    //   which target_forward of 1 token is not here, as it runs the draft too.
    // - target_prefill and draft_prefill of k tokens (BATCH = 1 only): a prompt's prefill as
    //   llama-server runs it, the target's forward of k tokens with only the last position's
    //   logits, sampled (the request's first token), then the draft's forward of the same tokens
    //   (its cache, which common_speculative_process keeps in step); timed apart, as a server
    //   without a draft model runs the first alone.
    // Each at the given context lengths, the caches filled with the prompt's tokens, repeated.
    // With BATCH = B > 1 each step is llama-server's for B slots (tools/server/server-context.cpp
    // update_slots): every sequence holds ctx_len tokens; a draft step is ONE draft decode of one
    // token per sequence, each sampled by its own sequence's top-k 10 sampler; a verification is
    // ONE target decode of k tokens per sequence (all logits), the target sampler on all B * k
    // outputs, and the draft's decode of that same batch (only its last token output, as
    // common_speculative_process copies it); a target_step is ONE target decode of one token per
    // sequence, each sampled by its own sequence's target sampler.
    const int n_seq = n_batch_seq;
    std::vector<common_sampler_ptr> smpl_tgt;
    std::vector<common_sampler_ptr> smpl_dft;
    common_params_sampling draft_sampling;  // as common_speculative_impl_draft_simple builds it
    draft_sampling.no_perf = false;
    draft_sampling.top_k = 10;
    draft_sampling.samplers.assign(1, COMMON_SAMPLER_TYPE_TOP_K);
    for (int s = 0; s < n_seq; ++s) {  // one of each per sequence, as each slot has its own
        smpl_tgt.emplace_back(common_sampler_init(model_tgt, params.sampling));
        smpl_dft.emplace_back(common_sampler_init(llama_get_model(ctx_dft), draft_sampling));
    }
    for (int ctx_len : contexts) {
        for (llama_context * ctx : {ctx_tgt, ctx_dft}) {
            if (ctx_len + max_k > (int) llama_n_ctx_seq(ctx)) {
                fprintf(stderr, "simlab-llama-trace: context %d + %d tokens exceed a sequence's %u cells (-c / -np)\n",
                        ctx_len, max_k, llama_n_ctx_seq(ctx));
                return 1;
            }
        }
        std::vector<llama_token> fill(ctx_len);
        for (int i = 0; i < ctx_len; ++i) {
            fill[i] = inp[i % inp.size()];
        }
        for (llama_context * ctx : {ctx_tgt, ctx_dft}) {
            for (int s = 0; s < n_seq; ++s) {  // one sequence at a time: a batch holds at most -b tokens
                llama_memory_seq_rm(llama_get_memory(ctx), s, -1, -1);
                forward(ctx, fill, 0, false, s);
            }
        }
        auto clear = [&](llama_context * ctx) {
            for (int s = 0; s < n_seq; ++s) {
                llama_memory_seq_rm(llama_get_memory(ctx), s, ctx_len, -1);
            }
        };
        for (int rep = 0; rep < repeats; ++rep) {
            for (int k : ks) {
                std::vector<llama_token> toks(fill.begin(), fill.begin() + std::min(k, ctx_len));
                toks.resize(k, inp.back());
                const auto t0 = std::chrono::steady_clock::now();
                forward(ctx_tgt, toks, ctx_len, true, 0, n_seq);
                for (int i = 0; i < n_seq * k; ++i) {
                    common_sampler_sample(smpl_tgt[i / k].get(), ctx_tgt, i);
                }
                forward(ctx_dft, toks, ctx_len, false, 0, n_seq);
                const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                clear(ctx_tgt);
                clear(ctx_dft);
                fprintf(out, "L\ttarget_forward\t%d\t%d\t%d\t%.9g\t%d\n", k, ctx_len, rep, s, n_seq);
                if (n_seq == 1) {  // k prompt tokens prefilled: the target's forward, then the draft's
                    const double t = timed_prefill(ctx_tgt, toks, ctx_len, smpl_tgt[0].get());
                    clear(ctx_tgt);
                    fprintf(out, "L\ttarget_prefill\t%d\t%d\t%d\t%.9g\t%d\n", k, ctx_len, rep, t, n_seq);
                    const double d = timed_prefill(ctx_dft, toks, ctx_len, nullptr);
                    clear(ctx_dft);
                    fprintf(out, "L\tdraft_prefill\t%d\t%d\t%d\t%.9g\t%d\n", k, ctx_len, rep, d, n_seq);
                }
            }
            auto t0 = std::chrono::steady_clock::now();
            forward(ctx_tgt, {inp.back()}, ctx_len, true, 0, n_seq);
            for (int i = 0; i < n_seq; ++i) {
                common_sampler_sample(smpl_tgt[i].get(), ctx_tgt, i);
            }
            const double plain = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            clear(ctx_tgt);
            fprintf(out, "L\ttarget_step\t1\t%d\t%d\t%.9g\t%d\n", ctx_len, rep, plain, n_seq);
            t0 = std::chrono::steady_clock::now();
            forward(ctx_dft, {inp.back()}, ctx_len, true, 0, n_seq);
            for (int i = 0; i < n_seq; ++i) {
                common_sampler_sample(smpl_dft[i].get(), ctx_dft, i, true);
            }
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            clear(ctx_dft);
            fprintf(out, "L\tdraft_step\t1\t%d\t%d\t%.9g\t%d\n", ctx_len, rep, s, n_seq);
        }
    }
    fclose(out);
    llama_backend_free();
    return 0;
}
