package enginesim

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
)

// tokenIDs is the simulated tokenizer's ids for text: each bytesPerToken
// bytes, little-endian, as one id below 2^31 (a short last token padded
// with zeros). Equal texts give equal ids, and a block of ids names the
// text it holds, which is all a consumer of the KV-cache events needs.
func tokenIDs(text string) []uint32 {
	n := (len(text) + bytesPerToken - 1) / bytesPerToken
	ids := make([]uint32, n)
	for i := range ids {
		var b [4]byte
		copy(b[:], text[i*bytesPerToken:min(len(text), (i+1)*bytesPerToken)])
		ids[i] = binary.LittleEndian.Uint32(b[:]) & 0x7fffffff
	}
	return ids
}

// tokenizeRequest is vLLM's /tokenize body: a completions prompt or chat
// messages.
type tokenizeRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []chatMessage   `json:"messages"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// handleTokenize answers vLLM's /tokenize with the ids the engine would
// run the prompt with, the ones its BlockStored events carry.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	if _, _, err := s.resolve(req.Model); err != nil {
		writeError(w, err)
		return
	}
	var p prompt
	var err error
	switch {
	case req.Messages != nil:
		p, err = chatPrompt(req.Messages)
	case req.Prompt != nil:
		p, err = completionPrompt(req.Prompt)
	default:
		writeError(w, errorf(http.StatusBadRequest, "either prompt or messages is required"))
		return
	}
	if err != nil {
		writeError(w, errorf(http.StatusBadRequest, "%v", err))
		return
	}
	ids := p.tokenIDs()
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.MaxModelLen, Tokens: ids})
}
