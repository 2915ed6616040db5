/* chat.h — POST /v1/chat/completions: OpenAI "messages" (JSON) to the
 * prompt text of the model's chat template (model/chat_template.h).
 *
 * A message is {"role": "system"|"user"|"assistant", "content": C, ...}
 * where C is a string or a list of {"type":"text","text":T} parts (joined
 * with no separator); "name" and other keys are ignored. Everything else is
 * the client's error (HTTP 400, param "messages"): not a non-empty list, a
 * message that is not an object, a missing or non-string role, an unknown
 * role ("tool", "developer", "function"...), content missing, null, a
 * non-text part, or holding NUL. The rendered text is what the engine
 * tokenizes: special-token text is read only from the template's own text,
 * never from a message's content (prompt.h, tok_encode_guarded), and the
 * template's turn end (chat_format_turn_end) becomes an extra stop string.
 * See docs/chat-templates.md and docs/api.md.
 */
#ifndef STRATA_COORDINATOR_CHAT_H
#define STRATA_COORDINATOR_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "coordinator/api/api_error.h"
#include "coordinator/api/prompt.h"

/* Renders messages with fmt (enum chat_format), and the generation prompt
 * when add_generation_prompt (chat completions always), into out: text (malloc'd, NUL-terminated) and the contents' spans (plain).
 * 0, or -1 with e (400) and out empty. */
int chat_render_messages(json_t *messages, int fmt, bool add_generation_prompt, compl_prompt *out,
                         compl_error *e);

#endif
