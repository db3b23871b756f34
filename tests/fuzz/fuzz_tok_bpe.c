/* fuzz_tok_bpe: libFuzzer harness for the byte-level BPE tokenizer (engine/tokenizer_bpe.c, the
 * gpt2 pre-tokenizer through PCRE2) over ggml-vocab-gpt-2.gguf: encode and decode of the input
 * text (fuzz_tok.h). */
#include "fuzz_tok.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return tok_init("models/vocab/ggml-vocab-gpt-2.gguf");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return tok_one(data, size); }
