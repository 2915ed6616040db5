/* chat.c — OpenAI chat messages to the chat template's prompt text. See chat.h. */
#include "coordinator/api/chat.h"

#include <stdlib.h>
#include <string.h>

#include "model/chat_template.h"

/* The text of one message's content: a string, or text parts joined.
 * Returns a malloc'd string, or NULL with e. */
static char *content_text(json_t *c, size_t idx, compl_error *e) {
    if (json_is_string(c)) {
        if (memchr(json_string_value(c), '\0', json_string_length(c))) goto nul;
        return strndup(json_string_value(c), json_string_length(c));
    }
    if (!json_is_array(c)) {
        compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                        "messages[%zu]: 'content' must be a string or a list of text parts", idx);
        return NULL;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) ||
            strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                            "messages[%zu].content[%zu]: only {\"type\":\"text\",\"text\":...} "
                            "parts are supported",
                            idx, i);
            return NULL;
        }
        if (memchr(json_string_value(text), '\0', json_string_length(text))) goto nul;
        total += json_string_length(text);
    }
    char *s = malloc(total + 1), *p = s;
    if (!s) {
        compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    *p = '\0';
    return s;
nul:
    compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                    "messages[%zu]: 'content' must not contain NUL characters", idx);
    return NULL;
}

int chat_render_messages(json_t *messages, int fmt, bool add_generation_prompt, compl_prompt *out,
                         compl_error *e) {
    memset(out, 0, sizeof *out);
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                        "'messages' must be a non-empty list of messages");
        return -1;
    }
    size_t n = json_array_size(messages);
    chat_message *msgs = calloc(n, sizeof *msgs);
    char **texts = calloc(n, sizeof *texts);
    int rc = -1;
    if (!msgs || !texts) {
        compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        if (!json_is_object(m)) {
            compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                            "messages[%zu] must be an object", i);
            goto out;
        }
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role)) {
            compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                            "messages[%zu]: 'role' must be a string", i);
            goto out;
        }
        enum chat_role r;
        st_err err = {{0}};
        if (chat_role_parse(json_string_value(role), &r, &err) != 0) {
            compl_error_set(e, 400, "invalid_request_error", "messages", NULL, "messages[%zu]: %s",
                            i, err.msg);
            goto out;
        }
        if (!content || json_is_null(content)) {
            compl_error_set(e, 400, "invalid_request_error", "messages", NULL,
                            "messages[%zu]: message has no content", i);
            goto out;
        }
        if (!(texts[i] = content_text(content, i, e))) goto out;
        msgs[i].role = json_string_value(role);
        msgs[i].content = texts[i];
    }
    st_err err = {{0}};
    out->text = chat_apply_spans((enum chat_format)fmt, msgs, n, add_generation_prompt, &out->len, &out->plain,
                                 &out->n_plain, &err);
    if (!out->text) {
        compl_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s", err.msg);
        goto out;
    }
    rc = 0;
out:
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(msgs);
    return rc;
}
