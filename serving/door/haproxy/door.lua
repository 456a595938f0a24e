-- The front door's one reader of a request body (HAProxy 2.6, Lua 5.3).
--
-- HAProxy routes a request by its JSON `model`, vLLM serves the `model` its
-- own parser reads: they must be the same value, or a caller could be routed
-- (and checked against its grants) as one model and served as another. So the
-- door reads the body strictly and refuses what two parsers could read two
-- ways: duplicate top-level keys (Python keeps the last, a naive scanner the
-- first), a `model` that is not a string, and anything that is not plain JSON
-- (NaN and Infinity, which Python accepts; a byte-order mark; trailing bytes;
-- invalid UTF-8). Top-level keys and the `model` value are decoded exactly
-- (escapes included: Python sees "mod\u0065l" as "model"); nested values are
-- only checked, never built.
--
-- It also refuses the vLLM request fields a caller may not send (REFUSED_FIELDS,
-- MEDIA_PARTS; docs/security.md says why each), and counts the work a request
-- asks for (`n` times the prompts of a list), which the door's requests per
-- minute count (haproxy.py).
--
-- Fail closed (docs/door.md#fail-closed): the door routes a request only when
-- this action ran to its end and set txn.body_read. A runtime error or Lua's
-- memory limit is caught here and named in txn.body_failed; HAProxy's
-- `tune.lua.session-timeout` ends the action from outside, which leaves
-- txn.body_started without txn.body_read. haproxy.py answers each with a 503
-- of its own. Bounds, so that no body reaches the timeout: the body is at most
-- the door's body limit (a larger one gets a 413 before this runs), the scan
-- is one linear pass with an explicit stack (MAX_DEPTH, no recursion), at
-- most MAX_KEYS top-level keys of at most MAX_KEY_BYTES (so Lua 5.3's string
-- hash, which an attacker can make collide, is never fed many), nested keys
-- are not built (only the few positions where a media part's name can stand
-- are compared), and `model` is built only when it is short enough to be a
-- served name.
--
-- Sets txn.model (the decoded name) when the body has one, txn.work (the
-- requests it counts as), or txn.body_error (a sentence naming the problem,
-- answered as a 400) and txn.body_param (the field it names).

local MAX_DEPTH = 128
-- An OpenAI or vLLM request has about 70 possible fields.
local MAX_KEYS = 256
local MAX_KEY_BYTES = 256
-- registry.models.SERVED_NAME_PATTERN: a letter or digit, then at most 127 of
-- letters, digits, '.', '_' and '-'. The base model's name is any (it is the
-- action's argument, compared whole).
local MAX_MODEL_BYTES = 128
local SERVED_NAME = "^[A-Za-z0-9][A-Za-z0-9._-]*$"
-- The most a request counts as (`n` times its prompts), so that the door's
-- count of it stays small work; a request past any limit is refused anyway.
local MAX_WORK = 100000

-- Top-level fields vLLM 0.32 reads that no caller of a shared fleet may send
-- (docs/security.md, "vLLM's request fields"): a template the server renders,
-- tensors it deserialises, regexes and grammars it compiles without a bound,
-- server-side code by name, another request's id or priority.
local REFUSED_FIELDS = {
  chat_template = "a chat template is rendered by the replica",
  chat_template_kwargs = "chat template arguments are passed to the replica's renderer",
  prompt_embeds = "embeddings are deserialised by the replica",
  guided_regex = "a regular expression is compiled by the replica without a bound",
  guided_grammar = "a grammar is compiled by the replica without a bound",
  guided_whitespace_pattern = "a regular expression is compiled by the replica without a bound",
  guided_decoding_backend = "the decoding backend is the operator's choice",
  structured_outputs = "regular expressions and grammars are compiled by the replica without a bound",
  logits_processors = "logits processors are code the replica loads by name",
  vllm_xargs = "extra arguments reach the replica's custom processors",
  kv_transfer_params = "KV transfer is the operator's",
  mm_processor_kwargs = "media processing is off at this door",
  media_io_kwargs = "media processing is off at this door",
  priority = "scheduling priority is the operator's",
  request_id = "the door sets each request's id",
}
-- The names of a chat message's content parts that make the replica fetch a
-- URL or decode media (messages[i].content[j].<name>).
local MEDIA_PARTS = {
  image_url = true,
  audio_url = true,
  video_url = true,
  input_audio = true,
  file = true,
  image_embeds = true,
  image_pil = true,
  audio_embeds = true,
}
local MAX_MEDIA_NAME = 12

local function scan_string(s, i)
  local j = i + 1
  local escaped = false
  while true do
    local k = s:find('["\\\0-\31]', j)
    if not k then
      return nil, "an unterminated string"
    end
    local c = s:byte(k)
    if c == 34 then
      return k + 1, escaped
    elseif c == 92 then
      escaped = true
      local e = s:byte(k + 1)
      if e == 117 then -- \uXXXX
        if not s:find("^%x%x%x%x", k + 2) then
          return nil, "an invalid \\u escape"
        end
        j = k + 6
      elseif e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116 then
        j = k + 2
      else
        return nil, "an invalid escape"
      end
    else
      return nil, "a control character inside a string"
    end
  end
end

local SIMPLE = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

-- The exact text of an escaped string's body (already checked by scan_string),
-- as Python's json module decodes it, left to right; nil for a lone surrogate,
-- which no name the door routes can hold.
local function unescape(body)
  local parts, i = {}, 1
  while true do
    local k = body:find("\\", i, true)
    if not k then
      parts[#parts + 1] = body:sub(i)
      return table.concat(parts)
    end
    parts[#parts + 1] = body:sub(i, k - 1)
    local e = body:sub(k + 1, k + 1)
    if e == "u" then
      local code = tonumber(body:sub(k + 2, k + 5), 16)
      i = k + 6
      if code >= 0xD800 and code <= 0xDBFF then
        local low = body:sub(i, i + 1) == "\\u" and tonumber(body:sub(i + 2, i + 5), 16)
        if not low or low < 0xDC00 or low > 0xDFFF then
          return nil
        end
        code = 0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00)
        i = i + 6
      elseif code >= 0xDC00 and code <= 0xDFFF then
        return nil
      end
      parts[#parts + 1] = utf8.char(code)
    else
      parts[#parts + 1] = SIMPLE[e]
      i = k + 2
    end
  end
end

local function decoded(s, i, after, escaped)
  local body = s:sub(i + 1, after - 2)
  if escaped then
    return unescape(body)
  end
  return body
end

local function scan_number(s, i)
  local j = i
  if s:byte(j) == 45 then
    j = j + 1
  end
  local c = s:byte(j)
  if c == 48 then
    j = j + 1
  elseif c and c >= 49 and c <= 57 then
    local _, e = s:find("^%d*", j + 1)
    j = e + 1
  else
    return nil
  end
  if s:byte(j) == 46 then
    local _, e = s:find("^%d+", j + 1)
    if not e then
      return nil
    end
    j = e + 1
  end
  c = s:byte(j)
  if c == 101 or c == 69 then
    j = j + 1
    c = s:byte(j)
    if c == 43 or c == 45 then
      j = j + 1
    end
    local _, e = s:find("^%d+", j)
    if not e then
      return nil
    end
    j = e + 1
  end
  return j
end

local function ws(s, i)
  return s:find("[^ \t\r\n]", i) or (#s + 1)
end

local function refuse(why, param)
  return { problem = why, param = param or "body" }
end

-- Whether a top-level key's value is counted as prompts: `prompt`
-- (/v1/completions) and `input` (/v1/embeddings) may be a list of them.
local LISTS = { prompt = true, input = true }

-- Reads the body: a table {model, work} or {problem, param}.
local function read_body(s, base)
  if not utf8.len(s) then
    return refuse("the request body is not valid UTF-8")
  end
  local i = ws(s, 1)
  if s:byte(i) ~= 123 then
    return refuse("the request body is not a JSON object")
  end
  -- stack[n]: 123 in an object, 91 in an array; expect: what may come next.
  local stack, depth = { 123 }, 1
  local seen, keys, model, model_kind = {}, 0, nil, nil
  local n, prompts, token_list = 1, 0, false
  local expect = "key_or_end" -- key_or_end | key | colon | value | value_or_end | comma_or_end
  local key = nil
  i = i + 1
  while true do
    i = ws(s, i)
    local c = s:byte(i)
    if not c then
      return refuse("the request body ends inside a JSON value")
    end
    local top = stack[depth]
    if expect == "key_or_end" or expect == "key" then
      if c == 125 and expect == "key_or_end" then
        expect, i = "close", i
      elseif c == 34 then
        local after, escaped = scan_string(s, i)
        if not after then
          return refuse("the request body has " .. escaped)
        end
        if depth == 1 then
          keys = keys + 1
          if keys > MAX_KEYS then
            return refuse("the request body has more than " .. MAX_KEYS .. " top-level keys")
          end
          if after - i - 2 > MAX_KEY_BYTES then
            return refuse("the request body has a top-level key longer than " .. MAX_KEY_BYTES .. " bytes")
          end
          key = decoded(s, i, after, escaped)
          if key == nil then
            return refuse("the request body has a key with an invalid \\u escape")
          end
          if seen[key] then
            return refuse("the request body has the key `" .. key:sub(1, 64) .. "` twice")
          end
          seen[key] = true
          if REFUSED_FIELDS[key] then
            return refuse("`" .. key .. "` is not accepted by this door: " .. REFUSED_FIELDS[key], key)
          end
        elseif depth == 5 and key == "messages" and stack[2] == 91 and stack[3] == 123 and stack[4] == 91 then
          -- A content part (messages[i].content[j]): only its names are built,
          -- and only those short enough to be a media part's.
          if escaped or after - i - 2 <= MAX_MEDIA_NAME then
            local name = after - i - 2 <= 6 * MAX_MEDIA_NAME and decoded(s, i, after, escaped)
            if name and MEDIA_PARTS[name] then
              return refuse("`" .. name .. "` content is not accepted by this door: "
                .. "the replicas fetch and decode no media", "messages")
            end
          end
        end
        i, expect = after, "colon"
      else
        return refuse("the request body is not valid JSON (expected a key at byte " .. i .. ")")
      end
    elseif expect == "colon" then
      if c ~= 58 then
        return refuse("the request body is not valid JSON (expected ':' at byte " .. i .. ")")
      end
      i, expect = i + 1, "value"
    elseif expect == "value" or expect == "value_or_end" then
      local is_model = depth == 1 and key == "model"
      if depth == 2 and top == 91 and LISTS[key] and c ~= 93 then
        -- One prompt per string or token list; a list of numbers is one prompt.
        if c == 34 or c == 91 then
          prompts = prompts + 1
        else
          token_list = true
        end
      end
      if c == 93 and expect == "value_or_end" then
        expect = "close"
      elseif c == 123 or c == 91 then
        if depth >= MAX_DEPTH then
          return refuse("the request body nests deeper than " .. MAX_DEPTH .. " levels")
        end
        depth = depth + 1
        stack[depth] = c
        if is_model then
          model_kind = c == 123 and "an object" or "an array"
        end
        i = i + 1
        expect = c == 123 and "key_or_end" or "value_or_end"
      else
        local after
        if c == 34 then
          local escaped
          after, escaped = scan_string(s, i)
          if not after then
            return refuse("the request body has " .. escaped)
          end
          if is_model then
            -- Built only when it can be a name: at most 6 bytes a character escaped.
            if after - i - 2 <= 6 * math.max(MAX_MODEL_BYTES, #base) then
              model = decoded(s, i, after, escaped)
              if model == nil then
                return refuse("`model` has an invalid \\u escape", "model")
              end
            end
            if model ~= base and not (model and #model <= MAX_MODEL_BYTES and model:find(SERVED_NAME)) then
              return refuse("`model` is not a served name (a letter or digit, then letters, "
                .. "digits, '.', '_' or '-', at most " .. MAX_MODEL_BYTES .. " in all)", "model")
            end
          end
        elseif c == 116 and s:sub(i, i + 3) == "true" then
          after = i + 4
        elseif c == 102 and s:sub(i, i + 4) == "false" then
          after = i + 5
        elseif c == 110 and s:sub(i, i + 3) == "null" then
          after = i + 4
        else
          after = scan_number(s, i)
          if not after then
            return refuse("the request body is not valid JSON (a value at byte " .. i .. ")")
          end
          if depth == 1 and key == "n" and after - i <= 9 then
            -- vLLM refuses any other `n`; only a count of choices counts here.
            n = math.tointeger(tonumber(s:sub(i, after - 1))) or 1
          end
        end
        if is_model and c ~= 34 then
          model_kind = (c == 110 and "null") or ((c == 116 or c == 102) and "a boolean") or "a number"
        end
        i, expect = after, "comma_or_end"
      end
    elseif expect == "comma_or_end" then
      if c == 44 then
        i = i + 1
        expect = top == 123 and "key" or "value"
      elseif (c == 125 and top == 123) or (c == 93 and top == 91) then
        expect = "close"
      else
        return refuse("the request body is not valid JSON (at byte " .. i .. ")")
      end
    end
    if expect == "close" then
      i = i + 1
      depth = depth - 1
      if depth == 0 then
        if ws(s, i) <= #s then
          return refuse("the request body has bytes after its JSON object")
        end
        if model_kind then
          return refuse("`model` must be a string, not " .. model_kind, "model")
        end
        if prompts == 0 or token_list then
          prompts = math.max(prompts, 1)
        end
        return { model = model, work = math.min(math.max(n, 1) * prompts, MAX_WORK) }
      end
      expect = "comma_or_end"
    end
  end
end

local function inspect(txn, base)
  local verdict = read_body(txn.sf:req_body() or "", base)
  if verdict.problem then
    txn:set_var("txn.body_error", verdict.problem)
    txn:set_var("txn.body_param", verdict.param)
  else
    if verdict.model then
      txn:set_var("txn.model", verdict.model)
    end
    txn:set_var("txn.work", verdict.work)
  end
end

-- `base`: the deployment's base model, a served name of any shape.
core.register_action("inspect_body", { "http-req" }, function(txn, base)
  txn:set_var("txn.body_started", 1)
  local ok, failure = pcall(inspect, txn, base)
  if not ok then
    -- Lua 5.3 raises its memory error with this very string; HAProxy 2.6 its
    -- session timeout as an error "execution timeout" (seen), which pcall
    -- catches too. Neither message holds a byte of the body.
    local kind = "error"
    if failure == "not enough memory" then
      kind = "memory"
    elseif type(failure) == "string" and failure:find("timeout", 1, true) then
      kind = "timeout"
    end
    txn:set_var("txn.body_failed", kind)
    return
  end
  txn:set_var("txn.body_read", 1)
end, 1)

-- A request for `n` choices of several prompts counts as that many toward
-- its caller's requests per minute (haproxy.py `_work_rules`): the key's
-- (sticky counter 1) and the department's (2) minute already counted it once.
-- One increment each, as HAProxy's own sc_inc_gpc0 does (exact across its
-- threads; 2.6 has no way to add more at once), and never past the limit by
-- more than one: the request is refused then, and more would be no news.
-- With peers, `others_var` holds the other doors' count of the same minute
-- (docs/door.md#peers), which this door's counter does not include.
local function add_work(txn, sc, used_var, limit_var, others_var, extra)
  local used = txn:get_var(used_var)
  local limit = txn:get_var(limit_var)
  if not used or not limit then
    return
  end
  local others = tonumber(txn:get_var(others_var)) or 0
  for _ = 1, math.min(extra, limit + 1 - used) do
    used = txn.f:sc_inc_gpc0(sc) + others
  end
  txn:set_var(used_var, used)
end

-- txn.work_counted last: a count cut short is refused (haproxy.py), as a body
-- read cut short is.
core.register_action("count_work", { "http-req" }, function(txn)
  local extra = (tonumber(txn:get_var("txn.work")) or 1) - 1
  add_work(txn, 1, "txn.rl_kused", "txn.rl_krpm", "txn.rl_k_others", extra)
  add_work(txn, 2, "txn.rl_dused", "txn.rl_drpm", "txn.rl_d_others", extra)
  txn:set_var("txn.work_counted", 1)
end, 0)

-- The hold (docs/door.md#holding): while the control plane swaps a model on
-- the only replica that serves it, its new requests wait here instead of
-- meeting the gap (Knative's activator, inside the door). held.map (its path in
-- DOOR_HELD_MAP, set by haproxy.cfg) maps a served name to
-- "<deadline, epoch ms>-<owner>"; only the runtime API on the door's UNIX
-- socket changes it. Map.new at load time shares HAProxy's one copy of the
-- file's entries, so `add map`/`del map` are seen by the next lookup.
--
-- A request waits while its model has an entry whose deadline is ahead, and at
-- most `most_ms` (SERVING_DOOR_HOLD_SECONDS) from when it arrived: a worker
-- that died mid-hold, or a clock far off, never holds it longer. Then it goes
-- on to `use_backend`, which is chosen after this action: to the new version.
-- core.msleep yields (other requests run meanwhile) and a wait is not Lua
-- time, so tune.lua.session-timeout does not end it.
local HELD_MAP = os.getenv("DOOR_HELD_MAP")
local held = HELD_MAP and Map.new(HELD_MAP, Map._str)
-- How soon a held request sees its model released.
local HOLD_POLL_MS = 20

local function now_ms()
  local now = core.now()
  return now.sec * 1000 + now.usec // 1000
end

core.register_action("hold_model", { "http-req" }, function(txn, most_ms)
  local model = txn:get_var("txn.model")
  if not held or not model then
    return
  end
  local started = now_ms()
  local limit = started + (tonumber(most_ms) or 0)
  while true do
    local entry = held:lookup(model)
    local deadline = entry and tonumber(entry:match("^(%d+)"))
    local now = now_ms()
    local until_ms = deadline and math.min(deadline, limit)
    if not until_ms or now >= until_ms then
      break
    end
    core.msleep(math.max(1, math.min(HOLD_POLL_MS, until_ms - now)))
  end
  txn:set_var("txn.held_ms", now_ms() - started)
end, 1)
