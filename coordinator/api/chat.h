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
 * tokenizes (with parse_special: it contains the template's special-token
 * text) and the template's turn end (chat_format_turn_end) becomes an extra
 * stop string. See docs/chat-templates.md and docs/api.md.
 */
#ifndef STRATA_COORDINATOR_CHAT_H
#define STRATA_COORDINATOR_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "coordinator/api/api_error.h"

/* Renders messages with fmt (enum chat_format) and the generation prompt.
 * 0 with *out (malloc'd, NUL-terminated) and *len, or -1 with e (400). */
int chat_render_messages(json_t *messages, int fmt, char **out, size_t *len, compl_error *e);

#endif
