/* fuzz_tok_spm: libFuzzer harness for the SentencePiece tokenizer (engine/tokenizer_spm.c) over
 * stories260K.gguf's 512-token vocabulary: encode and decode of the input text (fuzz_tok.h). */
#include "fuzz_tok.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return tok_init("models/stories260K.gguf");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return tok_one(data, size); }
