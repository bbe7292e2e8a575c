package enginesim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// bytesPerToken is the simulated tokenizer: four bytes of text per token, the
// estimate the gateway uses too.
const bytesPerToken = 4

// prompt is a request's input as the engine sees it.
type prompt struct {
	text   string // canonical text, hashed for the prefix cache and the answer
	tokens int
	ids    []uint32 // the client's token ids, for a prompt sent as ids
}

// tokenIDs are the ids the engine runs the prompt with.
func (p prompt) tokenIDs() []uint32 {
	if p.ids != nil {
		return p.ids
	}
	return tokenIDs(p.text)
}

// chatPrompt renders messages the way a chat template would: each role and
// content in order.
func chatPrompt(msgs []chatMessage) (prompt, error) {
	var b strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return prompt{}, fmt.Errorf("messages[%d].role is required", i)
		}
		text, err := contentText(m.Content, "text")
		if err != nil {
			return prompt{}, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>")
		b.WriteString(text)
		b.WriteString("\n")
	}
	return textPrompt(b.String()), nil
}

func textPrompt(s string) prompt {
	return prompt{text: s, tokens: max(1, (len(s)+bytesPerToken-1)/bytesPerToken)}
}

// completionPrompt reads a completions prompt: a string, token ids, or a
// batch of exactly one of those.
func completionPrompt(raw json.RawMessage) (prompt, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return textPrompt(s), nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return prompt{text: string(raw), tokens: len(ids), ids: ids}, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err == nil && len(batch) == 1 {
		return completionPrompt(batch[0])
	}
	return prompt{}, errors.New("prompt must be a string or a list of token ids (batches of more than one are not supported)")
}

// prefixHashes cuts the prompt into blocks of blockTokens tokens and chains a
// hash over the full ones: h[i] = hash(h[i-1], block[i]). A partial last block
// is never cached, as in vLLM.
func prefixHashes(text string, blockTokens int) []uint64 {
	size := blockTokens * bytesPerToken
	n := len(text) / size
	out := make([]uint64, 0, n)
	var prev [8]byte
	var d xxhash.Digest
	for i := range n {
		d.Reset()
		_, _ = d.Write(prev[:])
		_, _ = d.WriteString(text[i*size : (i+1)*size])
		h := d.Sum64()
		binary.LittleEndian.PutUint64(prev[:], h)
		out = append(out, h)
	}
	return out
}

// vocabularyText is what the simulated model says, one word per token.
const vocabularyText = "the engine answers with plain words that follow a fixed order so every " +
	"run reads alike and tests can check them while routing keeps prefix blocks warm " +
	"and batches grow under load as tokens flow steady"

// vocabulary turns a prompt's seed into its deterministic answer.
type vocabulary []string

func newVocabulary() vocabulary { return strings.Fields(vocabularyText) }

// word is the i-th (0-based) token of the answer to a prompt with the given
// seed. It ends with a space, like a detokenized word piece.
func (v vocabulary) word(seed uint64, i int) string {
	return v[(seed+uint64(i)*7)%uint64(len(v))] + " "
}

// id is the token id of word(seed, i): its place in the vocabulary.
func (v vocabulary) id(seed uint64, i int) uint32 {
	return uint32((seed + uint64(i)*7) % uint64(len(v)))
}

// ids appends the token ids of the answer's tokens from..to-1 to dst.
func (v vocabulary) ids(dst []uint32, seed uint64, from, to int) []uint32 {
	for i := from; i < to; i++ {
		dst = append(dst, v.id(seed, i))
	}
	return dst
}

// answer is the tokens from..to-1 of the answer.
func (v vocabulary) answer(seed uint64, from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(v.word(seed, i))
	}
	return b.String()
}

// embeddingDim is the length of the simulated embedding vectors.
const embeddingDim = 64

// embed returns a unit vector that depends only on the input.
func embed(input string) []float32 {
	x := xxhash.Sum64String(input)
	v := make([]float32, embeddingDim)
	var norm float64
	for i := range v {
		// splitmix64: a stateless sequence from the input's hash.
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		f := float64(z>>11)/float64(1<<53)*2 - 1
		v[i] = float32(f)
		norm += f * f
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}

// embeddingInputs reads an embeddings input: a string, a list of strings,
// token ids, or a list of token-id lists.
func embeddingInputs(raw json.RawMessage) ([]prompt, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []prompt{textPrompt(s)}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, errors.New("input must be a string, a list of strings or token ids")
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil {
		return []prompt{{text: string(raw), tokens: len(ids)}}, nil
	}
	out := make([]prompt, 0, len(items))
	for i, it := range items {
		p, err := completionPrompt(it)
		if err != nil {
			return nil, fmt.Errorf("input[%d]: %w", i, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// input is a prompt and where its answer starts: a seed for the word
// sequence and the index of its first word.
type input struct {
	prompt prompt
	seed   uint64
	from   int
}

// promptInput is the input of a prompt read by readPrompt: its answer
// from the first word.
func (s *Server) promptInput(readPrompt func() (prompt, error)) func() (input, error) {
	return func() (input, error) {
		p, err := readPrompt()
		if err != nil {
			return input{}, err
		}
		return input{prompt: p, seed: s.seedOf(p.text)}, nil
	}
}

// chatInput renders the messages. With continueFinal the final message is
// the start of the answer, left open: the model goes on from the word after
// its last, so a continuation of an interrupted answer reads as the whole
// answer would have. The continued words count as one prompt token each,
// the tokens the model generated them as.
func (s *Server) chatInput(msgs []chatMessage, continueFinal bool) (input, error) {
	if !continueFinal {
		p, err := chatPrompt(msgs)
		if err != nil {
			return input{}, err
		}
		return input{prompt: p, seed: s.seedOf(p.text)}, nil
	}
	last := len(msgs) - 1
	head, err := chatPrompt(msgs[:last])
	if err != nil {
		return input{}, err
	}
	if msgs[last].Role == "" {
		return input{}, fmt.Errorf("messages[%d].role is required", last)
	}
	text, err := contentText(msgs[last].Content, "text")
	if err != nil {
		return input{}, fmt.Errorf("messages[%d].content: %w", last, err)
	}
	if last == 0 {
		head = prompt{}
	}
	words := len(strings.Fields(text))
	p := prompt{text: head.text + "<|" + msgs[last].Role + "|>" + text, tokens: max(1, head.tokens+words)}
	return input{prompt: p, seed: s.seedOf(head.text), from: words}, nil
}

// completionInput is a completions prompt's input. In the deterministic
// text mode a prompt ending with the answer's first k words is answered
// from word k, and those words count as one prompt token each.
func (s *Server) completionInput(p prompt) input {
	if !s.cfg.DeterministicText {
		return input{prompt: p, seed: s.seedOf(p.text)}
	}
	k, rest := s.words.continued(p.text)
	if k > 0 {
		p.tokens = textPrompt(rest).tokens + k
		if rest == "" {
			p.tokens = k
		}
	}
	return input{prompt: p, from: k}
}

// seedOf is the seed of a prompt's answer: one for every prompt in the
// deterministic text mode.
func (s *Server) seedOf(text string) uint64 {
	if s.cfg.DeterministicText {
		return 0
	}
	return xxhash.Sum64String(text)
}

// maxContinued bounds the words continued() compares.
const maxContinued = 1 << 16

// continued finds the largest k such that text ends with the first k words
// of the seed-0 answer, and returns it with the text before them.
func (v vocabulary) continued(text string) (k int, rest string) {
	if !strings.HasSuffix(text, " ") {
		return 0, text
	}
	fields := strings.Fields(text)
	if len(fields) > maxContinued {
		fields = fields[len(fields)-maxContinued:]
	}
	n := len(fields)
	for k = n; k > 0; k-- {
		ok := true
		for j := k - 1; j > 0 && ok; j-- {
			ok = fields[n-k+j]+" " == v.word(0, j)
		}
		// The first word may be glued to the prompt before it.
		if a := v.answer(0, 0, k); ok && strings.HasSuffix(text, a) {
			return k, strings.TrimSuffix(text, a)
		}
	}
	return 0, text
}
